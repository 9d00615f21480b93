"""1F1B step time: the stated formulas on hand-computed cases, and the orderings any sane model
keeps (overlap never slower, more bandwidth never slower, compression pays on a slow link)."""
import pytest
import torch

from megatron.cc.config import CompressionConfig
from megatron.cc.plan.links import cluster_from_dict
from megatron.cc.plan.shapes import Layout, ModelShape
from megatron.cc.plan.step_time import stage_flops_params, step_time

M4 = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=1024,
                seq_length=32)


def _cluster(nodes=2, gpn=1, inter_gbps=1.0, dcs=1, lat_us=100.0, tflops=1.0):
    links = {"intra_node": {"bandwidth_gbps": 1000, "latency_us": 0},
             "inter_node": {"bandwidth_gbps": inter_gbps, "latency_us": lat_us},
             "inter_datacentre": {"bandwidth_gbps": inter_gbps, "latency_us": lat_us}}
    return cluster_from_dict({"nodes": nodes, "gpus_per_node": gpn, "tflops_per_gpu": tflops,
                              "datacentres": dcs, "links": links})


def test_compute_is_the_6NT_rule():
    lay = Layout(1, 1, 1, micro_batch_size=2, num_microbatches=3)
    t = step_time(M4, lay, CompressionConfig(), _cluster(nodes=1))
    n = stage_flops_params(M4, lay, 0)
    assert n == sum(12 * 64 * 64 + 13 * 64 for _ in range(4)) + 2 * 64 + 1024 * 64
    assert t.compute == pytest.approx(6 * n * 32 * 2 * 3 / 1e12)
    assert (t.bubble, t.pp, t.dp, t.emb) == (0, 0, 0, 0) and t.utilisation == 1


def test_tensor_parallel_sums_lengthen_every_micro_batch():
    """tp = 2 in one node at 1000 Gbit/s, no latency: per micro-batch 4 per layer + the output
    layer + the embedding lookup ring all-reduces of (S, B, H) fp32, and cross entropy's 3 (B, S);
    --mp-acti-comp / --mp-grad-comp replace a sum by P and Q rings plus the codec."""
    lay = Layout(2, 1, 1, micro_batch_size=2, num_microbatches=3)
    bw = 1000e9 / 8
    ring = lambda x: 2 * (2 - 1) / 2 * x / bw   # noqa: E731
    raw, n = 32 * 2 * 64 * 4, 32 * 2
    t = step_time(M4, lay, CompressionConfig(), _cluster(nodes=1, gpn=2))
    assert t.tp == pytest.approx(3 * ((4 * 4 + 2) * ring(raw) + ring(3 * n * 4)))
    c = CompressionConfig(mp_acti_comp=True, mp_acti_comp_rank=4, mp_grad_comp=True,
                          mp_grad_comp_rank=4)
    # on fast links the codec costs more than it saves; over 1 Gbit/s between the tp ranks
    # (two nodes) it pays
    assert step_time(M4, lay, c, _cluster(nodes=1, gpn=2)).tp > t.tp
    slow, comp = (step_time(M4, lay, cc, _cluster(nodes=2, gpn=1, lat_us=0))
                  for cc in (CompressionConfig(), c))
    assert comp.tp < slow.tp / 2 and comp.compute == slow.compute
    assert step_time(M4, Layout(1, 1, 1, micro_batch_size=2, num_microbatches=3),
                     CompressionConfig(), _cluster(nodes=1)).tp == 0


def test_pipeline_transfer_on_the_critical_path():
    lay = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4)
    cl = _cluster(inter_gbps=1.0, lat_us=100)
    sync = step_time(M4, lay, CompressionConfig(), cl)
    msg = 2 * (100e-6 + 32 * 2 * 64 * 4 / (1e9 / 8))        # one message each way
    # the fill and drain messages alone, then M - 1 batches whose two messages cross at once
    assert sync.pp == pytest.approx(msg + 3 * msg / 2)
    over = step_time(M4, lay, CompressionConfig(), cl, overlap=True)
    # overlapped: two chains of round trips interleave, so a period is the mean of the round
    # trip (both messages and both stages' compute) and the downstream stage's compute
    rate = 1e12
    slot0, slot1 = (6 * stage_flops_params(M4, lay, s) * 32 * 2 / rate for s in (0, 1))
    assert slot1 > slot0 > 0 and sync.compute == pytest.approx(4 * slot1)
    period = max(slot1, (msg + slot0 + slot1) / 2)
    assert over.pp == pytest.approx(msg + 3 * (period - slot1))
    assert over.total <= sync.total


def test_synchronous_period_waits_for_each_neighbours_message():
    """Sync 1F1B: stage s waits each period for the gradient from below and the activation from
    above, so P = max_s(slot_s + [s > 0] c_f + [s < pp - 1] c_b). At pp 2 a compressed forward
    lets the downstream stage's longer slot hide the gradient; a middle stage pays both."""
    from megatron.cc.plan.step_time import sync_period
    assert sync_period([0.141, 0.235], 0.3, 0.3) == pytest.approx(0.535)   # uncompressed
    assert sync_period([0.141, 0.235], 0.01, 0.077) == pytest.approx(0.245)  # hidden
    assert sync_period([0.141, 0.235], 0.01, 0.387) == pytest.approx(0.528)  # partly
    assert sync_period([0.2, 0.2, 0.2], 0.1, 0.05) == pytest.approx(0.35)   # the middle
    lay = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4)
    cl = _cluster(inter_gbps=1.0, lat_us=0)
    c = CompressionConfig(forward_compress_method="fixpoint", forward_bits=4)
    cl.codec_throughput_gbs = {"fixpoint": 1e6}                 # codec time ~0
    t = step_time(M4, lay, c, cl)
    slot0, slot1 = (6 * stage_flops_params(M4, lay, s) * 32 * 2 / 1e12 for s in (0, 1))
    x = 32 * 2 * 64 * 4
    c_b = x / (1e9 / 8)
    from megatron.cc.plan.channel_bytes import channel_bytes
    tot = channel_bytes(M4, lay, c)["pp-fwd"]
    c_f = tot["sent"] / tot["messages"] / (1e9 / 8)
    assert c_f < c_b / 4
    period = max(slot0 + c_b, slot1 + c_f)
    assert t.pp == pytest.approx(c_f + c_b + 3 * (period - slot1))


def test_overlapped_period_of_1f1b():
    """E_(k+2) = max(E_k + c_b + slot_s + c_f, E_(k+1)) + slot_(s+1), iterated, settles to
    the closed form; neither compute nor a direction's messages can be outrun."""
    from megatron.cc.plan.step_time import overlapped_period
    for slots, c_f, c_b in [([0.03, 0.26], 0.44, 0.44), ([0.2, 0.2, 0.2], 0.1, 0.05),
                            ([0.1, 0.5], 0.01, 0.02)]:
        for s in range(len(slots) - 1):
            E = [0.0, slots[s + 1]]
            for k in range(200):
                E.append(max(E[k] + c_b + slots[s] + c_f, E[k + 1]) + slots[s + 1])
            # consecutive backwards pair up (two chains): the mean over two is the period
            assert (E[-1] - E[-3]) / 2 == pytest.approx(
                max(slots[s + 1], (c_f + c_b + slots[s] + slots[s + 1]) / 2))
        assert overlapped_period(slots, c_f, c_b) == pytest.approx(max(
            max(slots), c_f, c_b, *[(c_f + c_b + a + b) / 2 for a, b in zip(slots, slots[1:])]))
    assert overlapped_period([0.03, 0.26], 0.44, 0.44) == pytest.approx((0.88 + 0.29) / 2)
    assert overlapped_period([0.1, 0.1], 5.0, 0.0) == 5.0   # one direction's messages


def test_overlapped_codecs_run_on_the_stages_not_the_link():
    """Overlapped, a codec's time lengthens the stages that encode and decode (half each end:
    the table has encode + decode together) and is not hidden behind compute like a transfer;
    a codec slower than the compute sets the period."""
    from megatron.cc.plan.step_time import (codec_seconds, stage_flops_params, with_codecs)
    assert with_codecs([1.0, 2.0, 3.0], 0.4) == pytest.approx([1.2, 2.4, 3.2])
    lay = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4)
    c = CompressionConfig(forward_compress_method="fixpoint")
    cl = _cluster(inter_gbps=1000.0, lat_us=0)
    cl.codec_throughput_gbs = {"fixpoint": 1e-6}           # 16 KiB: ~16 s of codec
    over = step_time(M4, lay, c, cl, overlap=True)
    k = codec_seconds(cl, "fixpoint", 32 * 2 * 64 * 4)
    slot1 = 6 * stage_flops_params(M4, lay, 1) * 32 * 2 / 1e12
    assert k > 100 * slot1
    period = slot1 + k / 2                                  # stage 1 decodes every message
    sent = over.pp - (k + 3 * (period - slot1))             # the fill's transfers, ~0
    assert 0 <= sent < 1e-3 * k, over
    # interleaved (vp 2 at pp 2: B = 3 messages a micro-batch): each rank's half of every
    # message's codec, none hidden, behind fill and drain's whole ones
    lay2 = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4, virtual_stages=2)
    over2 = step_time(M4, lay2, c, cl, overlap=True)
    assert over2.pp == pytest.approx(k + (4 * 3 - 1) * k / 2, rel=1e-3)


def _two_sides(burst_kb=0.0, gbps=0.01):
    links = {"intra_node": {"bandwidth_gbps": 1000, "latency_us": 0},
             "inter_node": {"bandwidth_gbps": 1000, "latency_us": 0},
             "inter_datacentre": {"bandwidth_gbps": gbps, "latency_us": 0,
                                  "burst_kb": burst_kb}}
    return cluster_from_dict({"nodes": 4, "gpus_per_node": 1, "tflops_per_gpu": 0.001,
                              "datacentres": [[0, 3], [1, 2]], "links": links})


def test_a_shaped_links_burst_passes_what_the_compute_refills():
    """tbf's token bucket: refilled at the link's rate during one slot of compute, it passes
    min(burst, rate x slot) of each message for free; the rest pays the rate."""
    lay = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4)
    x = 32 * 2 * 64 * 4                                    # one 16 KiB activation message
    plain = step_time(M4, lay, CompressionConfig(), _two_sides(0))
    slot = (plain.compute + plain.bubble) / (4 + 1)
    rate = 0.01e9 / 8
    # fill and drain: both messages alone; 3 steady batches: the two crossing at once
    assert plain.pp == pytest.approx((2 + 3) * x / rate)
    for kb in (4, 64):
        t = step_time(M4, lay, CompressionConfig(), _two_sides(kb))
        free = min(kb * 1024, rate * slot)
        assert t.pp == pytest.approx((2 + 3) * max(0.0, x - free) / rate)
    assert step_time(M4, lay, CompressionConfig(), _two_sides(64)).pp == 0.0   # all free


def test_replicas_crossing_opposite_ways_share_each_direction_in_the_steady_state():
    """pp = 2 x dp = 2 with replica 0's stage 0 and replica 1's stage 1 on one side (the
    slow-link bench's 'both' placement): the two pipelines cross the link in opposite
    directions, so a fill or drain message has its direction to itself, but in the steady
    state each direction carries one replica's activation and the other's gradient at once.
    With both replicas' stage 0 on one side, a direction carries both replicas' activations
    (or both gradients) in every phase."""
    lay = Layout(1, 2, 2, micro_batch_size=2, num_microbatches=4)
    x = 32 * 2 * 64 * 4
    rate = 0.01e9 / 8
    opposite = step_time(M4, lay, CompressionConfig(), _two_sides())   # ranks 0,3 | 1,2
    assert opposite.pp == pytest.approx((2 + 3 * 2) * x / rate)
    same = step_time(M4, lay, CompressionConfig(), _two_sides().__class__(
        **{**_two_sides().__dict__, "datacentres": [[0, 1], [2, 3]]}))
    assert same.pp == pytest.approx((2 * 2 + 3 * 2) * x / rate)


def test_overlapped_replicas_share_a_direction_only_as_far_as_they_fill_it():
    """Overlapped, the 'both' placement: each replica's chain of round trips pays its own
    messages' transfers, and a direction carrying both replicas' messages bounds the period by
    their sum. Compute-bound, the direction idles between messages and sharing costs nothing
    (measured: uncompressed-both overlapped at 20 Mbit/s, 16443 ms; the old rule, every message
    paying the other's, predicted 19217: bench/results/slow_link_validation_cubic/)."""
    lay = Layout(1, 2, 2, micro_batch_size=2, num_microbatches=4)
    single = Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4)
    x = 32 * 2 * 64 * 4
    fast = _two_sides(gbps=0.01)    # 13 ms a message, 64 ms of compute a slot
    assert step_time(M4, lay, CompressionConfig(), fast, overlap=True).pp == pytest.approx(
        step_time(M4, single, CompressionConfig(), fast, overlap=True).pp)
    rate = 0.0005e9 / 8             # 262 ms a message: two per period fill each direction
    t = step_time(M4, lay, CompressionConfig(), _two_sides(gbps=0.0005), overlap=True)
    top = t.compute / 4             # the slowest stage's slot (compute = M slots)
    assert t.pp == pytest.approx(2 * x / rate + 3 * (2 * x / rate - top))


def test_interleaving_divides_the_bubble_and_multiplies_the_messages():
    """vp = 2: bubble / 2; a micro-batch crosses pp vp - 1 = 3 boundaries (the wrap-around
    one included). At pp = 2 all three join the same two ranks, so their link carries 3 M
    messages each way (measured so on the slow link: bench/results/slow_link_interleaved/);
    at pp = 4 the busiest pair carries vp = 2 per micro-batch."""
    from megatron.cc.plan.step_time import boundaries_per_pair
    assert [boundaries_per_pair(2, v) for v in (1, 2, 4)] == [1, 3, 7]
    assert [boundaries_per_pair(4, v) for v in (1, 2, 4)] == [1, 2, 4]
    cl = _cluster(inter_gbps=1.0, lat_us=100)
    plain, inter = (step_time(M4, Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4,
                                         virtual_stages=vp), CompressionConfig(), cl)
                    for vp in (1, 2))
    assert inter.compute == plain.compute and inter.bubble == pytest.approx(plain.bubble / 2)
    msg = 2 * (100e-6 + 32 * 2 * 64 * 4 / (1e9 / 8))
    # interleaved SYNC pairs each send with the next op's receive: the two directions' sends
    # do not meet, every message is paid in full
    assert inter.pp == pytest.approx((4 * 3 + 2 - 2) * msg)
    cl4 = _cluster(nodes=4, inter_gbps=1.0, lat_us=100)
    m8 = ModelShape(num_layers=8, hidden_size=64, num_attention_heads=4, vocab_size=1024,
                    seq_length=32)   # one layer per chunk at pp 4 x vp 2
    four = step_time(m8, Layout(1, 4, 1, micro_batch_size=2, num_microbatches=4,
                                virtual_stages=2), CompressionConfig(), cl4)
    assert four.pp == pytest.approx((4 * 2 + 4 - 2) * msg)
    from megatron.cc.plan.channel_bytes import channel_bytes
    c = CompressionConfig(inter_grad_comp=True, inter_grad_comp_rank=4,
                          inter_grad_comp_epilogue_only=True)
    b = channel_bytes(M4, Layout(1, 2, 1, micro_batch_size=2, num_microbatches=4,
                                 virtual_stages=2), c)
    assert b["pp-fwd"]["messages"] == 3 * 4 and b["pp-bwd"]["messages"] == 3 * 4
    assert b["pp-bwd"]["sent"] < b["pp-bwd"]["raw"]


def test_data_parallel_ring_all_reduce_and_shared_wan():
    lay = Layout(1, 1, 2, micro_batch_size=1, num_microbatches=1)
    c = CompressionConfig()
    one_dc = step_time(M4, lay, c, _cluster(inter_gbps=1.0, lat_us=0))
    x = 4 * M4.num_params()
    assert one_dc.dp == pytest.approx(2 * (2 - 1) / 2 * x / (1e9 / 8))
    # across two datacentres with tp = 2 ranks per stage: two flows share the WAN
    lay2 = Layout(2, 1, 2, micro_batch_size=1, num_microbatches=1)
    wan = step_time(M4, lay2, c, _cluster(nodes=2, gpn=2, dcs=2, inter_gbps=1.0, lat_us=0))
    from megatron.cc.plan.dp_bytes import stage_dp_bytes
    x2 = stage_dp_bytes(M4, lay2, c, 0, None)["sent"]
    assert wan.dp == pytest.approx(x2 / (1e9 / 8 / 2))


@pytest.mark.parametrize("c", [
    CompressionConfig(forward_compress_method="fixpoint", backward_compress_method="fixpoint"),
    CompressionConfig(grad_comp=True, grad_comp_rank=4),
    CompressionConfig(dp_mode="diloco", diloco_inner_steps=10, diloco_compression="int8"),
], ids=["fixpoint pp", "powersgd dp", "diloco int8"])
def test_compression_pays_on_a_slow_link_and_bandwidth_is_monotone(c):
    lay = Layout(1, 2, 2, micro_batch_size=2, num_microbatches=4, dtype=torch.float32)
    slow = _cluster(nodes=4, inter_gbps=0.01, lat_us=1000, tflops=10)
    assert step_time(M4, lay, c, slow).total < step_time(M4, lay, CompressionConfig(),
                                                         slow).total
    times = [step_time(M4, lay, c, slow.with_link("inter_node", g)).total
             for g in (0.01, 0.1, 1, 10, 100)]
    assert times == sorted(times, reverse=True)


def test_later_stages_start_their_all_reduce_in_the_cool_down():
    """pp = 2 x dp = 2, every dp group across nodes: stage 1 ends its last backward t_b before
    stage 0, so the step waits for max(dp_0, dp_1 - t_b); SC on stage 0 only (selective, way 1)
    leaves the exact stage the one with the head start."""
    from megatron.cc.plan.dp_bytes import stage_dp_bytes
    lay = Layout(1, 2, 2, micro_batch_size=2, num_microbatches=4)
    cl = _cluster(nodes=4, inter_gbps=0.1, lat_us=0, tflops=0.01)
    bw = 0.1e9 / 8
    for c in (CompressionConfig(), CompressionConfig(grad_comp=True, grad_comp_rank=4,
                                                     selective_grad_comp=True,
                                                     selective_grad_comp_way=1)):
        t = step_time(M4, lay, c, cl)
        t_b = t.compute / 4 * 2 / 3
        ring = [stage_dp_bytes(M4, lay, c, s, None)["sent"] / bw for s in (0, 1)]
        assert t.dp == pytest.approx(max(ring[0], ring[1] - t_b, 0.0))
        assert t_b > 0 and ring[1] > 0


def test_rank_order_decides_which_channel_crosses_the_datacentres():
    """pp = 2 x dp = 2 on 4 one-GPU nodes in 2 datacentres: megatron-core's tp-dp-pp puts
    stage 1 in the second datacentre (the pipeline crosses), tp-pp-dp puts replica 1 there (the
    dp all-reduce crosses); the bytes are the same, only the links differ."""
    from megatron.cc.plan.links import placement
    assert [placement(1, 2, 2)(0, d, p) for d in (0, 1) for p in (0, 1)] == [0, 2, 1, 3]
    assert [placement(1, 2, 2, "tp-pp-dp")(0, d, p) for d in (0, 1) for p in (0, 1)] == \
        [0, 1, 2, 3]
    links = {"intra_node": {"bandwidth_gbps": 1000, "latency_us": 0},
             "inter_node": {"bandwidth_gbps": 100, "latency_us": 0},
             "inter_datacentre": {"bandwidth_gbps": 0.1, "latency_us": 0}}
    cl = cluster_from_dict({"nodes": 4, "gpus_per_node": 1, "tflops_per_gpu": 1,
                            "datacentres": 2, "links": links})
    lay = dict(micro_batch_size=2, num_microbatches=4)
    default, replicas = (step_time(M4, Layout(1, 2, 2, rank_order=o, **lay), CompressionConfig(),
                                   cl) for o in ("tp-dp-pp", "tp-pp-dp"))
    assert default.pp > replicas.pp and default.dp < replicas.dp
    with pytest.raises(ValueError, match="rank_order"):
        Layout(rank_order="pp-dp-tp")
