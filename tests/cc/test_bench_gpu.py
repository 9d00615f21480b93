"""bench/bench_gpu.py's codec table on the CPU (--device cpu, tiny shapes): every required row
for both dtypes, the receiver's state, the lower bound and break-even by their formulas, the
JSON and its codec speeds, the PERF lines with each codec's targets."""
import contextlib
import io
import json
import math

import pytest
import torch

from bench import bench_gpu
from megatron.cc.plan import codec_speeds

SHAPE = (64, 2, 32)
BUCKET = 8192
MESSAGE_LABELS = ["fixpoint 2-bit absmax", "fixpoint 2-bit fitted", "fixpoint 4-bit absmax",
                  "fixpoint 4-bit fitted", "fixpoint 8-bit absmax", "fixpoint 8-bit fitted",
                  "lowrank r=16 (CB, LEP)", "rsvd r=16 (CB, LEP)", "delta 4-bit (device cache)",
                  "delta-lowbits 4/8 (device cache)", "tah t=64 4/3-bit",
                  "cocktail 0.1/0.2 4-bit"]
PLANNER_CODECS = {"fixpoint", "fixpoint-absmax", "lowrank", "rsvd", "delta", "delta-lowbits",
                  "tah", "cocktail", "subspace", "int8", "fp16", "sparseloco", "powersgd",
                  "fixpoint-b"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench_gpu") / "bench_gpu.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench_gpu.main(["--device", "cpu", "--shapes", ",".join(map(str, SHAPE)),
                               "--iters", "1", "--rotate-mb", "0", "--bucket-numel",
                               str(BUCKET), "--json", str(path)]) == 0
    return out.getvalue(), json.loads(path.read_text()), path


def _row(doc, label, dtype="bfloat16"):
    return next(r for r in doc["codecs"].values() if r["label"] == label and
                r["dtype"] == dtype)


def test_every_required_row_for_both_dtypes(smoke):
    text, doc, _ = smoke
    assert "SKIP training: needs CUDA" in text
    rows = list(doc["codecs"].values())
    for dtype in ("bfloat16", "float32"):
        have = [r["label"] for r in rows if r["dtype"] == dtype and r["message"] == str(SHAPE)]
        assert have == MESSAGE_LABELS
        sub = [r for r in rows if r["dtype"] == dtype and r["codec"] == "subspace"]
        assert len(sub) == 1 and sub[0]["shape"] == [64, 2, 10]
        assert sub[0]["raw_bytes"] == 64 * 2 * 32 * sub[0]["input_bytes"] // (64 * 2 * 10)
    dp = [r for r in rows if r["family"] == "dp"]
    assert {r["codec"] for r in dp} == {"int8", "fp16", "sparseloco"}
    assert all(r["shape"] == [BUCKET] and r["dtype"] == "float32" for r in dp)
    assert len(rows) == 2 * (len(MESSAGE_LABELS) + 1) + 3
    for r in rows:   # a row printed per measurement, every number finite
        assert bench_gpu.format_row(r) in text
        assert r["rotating_inputs"] >= bench_gpu.ROTATE_MIN and r["warmup"] >= bench_gpu.WARMUP
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in
                   ("encode_ms", "decode_ms", "copy_ms", "encode_lb_ms", "decode_lb_ms",
                    "encode_host_ms", "decode_host_ms"))
        assert r["launch_bound"] == [False, False]   # only said of CUDA calls
    for r in rows:   # the delta receivers' caches equal their senders'
        assert r["state_ok"] is (True if r["family"] == "delta" else None)


def test_lower_bound_and_break_even_by_hand(smoke):
    _, doc, _ = smoke
    r = _row(doc, "delta 4-bit (device cache)")
    x = 64 * 2 * 32 * 2                              # the bf16 message
    pay = 64 * 2 * 32 * 4 // 8 + 32 * 2              # 4-bit codes, a fp16 scale a channel
    cache = 2 * 2 * 64 * 32 * 4                      # 2 samples' fp32 rows, read and written
    assert (r["input_bytes"], r["payload_bytes"], r["state_bytes_encode"],
            r["state_bytes_decode"]) == (x, pay, cache, cache)
    per_ms = 2 * x / r["copy_ms"]
    assert r["encode_lb_ms"] == pytest.approx((x + pay + cache) / per_ms)
    assert r["decode_lb_ms"] == pytest.approx((pay + x + cache) / per_ms)
    assert r["encode_vs_lb"] == pytest.approx(r["encode_ms"] / r["encode_lb_ms"])
    assert r["copy_gbs"] == pytest.approx(per_ms / 1e6)
    seconds = (r["encode_ms"] + r["decode_ms"]) / 1e3
    assert r["break_even_gbps"] == pytest.approx((x - pay) * 8 / seconds / 1e9)
    assert r["encode_x"] == pytest.approx(r["encode_ms"] / r["copy_ms"])
    cb = _row(doc, "lowrank r=16 (CB, LEP)", "float32")   # E (128 x 32) and Q (32 x 16), fp32
    assert cb["state_bytes_encode"] == 2 * 4 * 128 * 32 + 2 * 4 * 32 * 16
    assert cb["state_bytes_decode"] == 0
    assert _row(doc, "rsvd r=16 (CB, LEP)")["state_bytes_encode"] == 2 * 4 * 128 * 32


def test_json_carries_the_planners_codec_speeds(smoke):
    _, doc, path = smoke
    assert doc["device"] == "cpu" and doc["training"] == {}
    assert "--device cpu" in doc["measured"]["command"] and doc["measured"]["date"]
    speeds = codec_speeds.load(str(path))                 # loadable as a codec-speeds file
    assert set(speeds) == PLANNER_CODECS
    assert set(doc["derived"]) == {"powersgd", "fixpoint-b"}
    fitted = [r for r in doc["codecs"].values() if r["codec"] == "fixpoint"]
    assert len(fitted) == 6
    import statistics
    assert speeds["fixpoint"] == pytest.approx(statistics.median(
        r["raw_bytes"] / ((r["encode_ms"] + r["decode_ms"]) * 1e-3) / 1e9 for r in fitted))


def test_perf_lines_with_each_codecs_targets(smoke):
    text, doc, _ = smoke
    perf = [l for l in text.splitlines() if l.startswith("PERF ")]
    assert len(perf) == 2 * len(doc["codecs"])
    r = _row(doc, "delta-lowbits 4/8 (device cache)", "float32")
    key = bench_gpu.row_key(r)
    assert any(l.startswith(f"PERF codec {key} encode / device copy: ") and
               "(target <= 4.00x)" in l for l in perf)
    assert any(l.startswith(f"PERF codec {key} decode / device copy: ") and
               "(target <= 3.00x)" in l for l in perf)
    for family, (enc, dec) in bench_gpu.TARGETS.items():
        rows = [x for x in doc["codecs"].values() if x["family"] == family]
        assert rows and all((x["target_encode_x"], x["target_decode_x"]) == (enc, dec)
                            for x in rows)
    assert bench_gpu.TARGETS["fixpoint"] == (1.5, 1.0) and bench_gpu.TARGETS["cb"] == (4, 1)


def _delta_group(label, sets=3):
    device = torch.device("cpu")
    cases = bench_gpu.message_cases(SHAPE, device, sets)
    case = next(c for c in cases if c.label == label)
    return case, bench_gpu.Group(str(SHAPE), SHAPE, torch.float32, [case], sets)


@pytest.mark.parametrize("label", ["delta 4-bit (device cache)",
                                   "delta-lowbits 4/8 (device cache)",
                                   "lowrank r=16 (CB, LEP)", "fixpoint 4-bit fitted"])
def test_receiver_fed_the_senders_payloads_decodes_as_a_lock_step_pair(label):
    """The bench's receiver, a separate instance decoding the sender's stored payloads in
    order, gets what a receiver decoding each message as it arrives gets (the training
    channel's order), on rotating inputs whose samples recur."""
    case, group = _delta_group(label)
    device = torch.device("cpu")
    xs = bench_gpu.make_inputs(SHAPE, torch.float32, group.sets, device)
    calls = 8
    sender, receiver = case.make(), case.make()
    payloads = bench_gpu.sender_payloads(sender, xs, group, case, calls)
    outputs = []
    bench_gpu.time_decode(receiver, payloads, group, case, 3, calls - 3, device, outputs)
    ref_tx, ref_rx = case.make(), case.make()
    for i in range(calls):
        ctx = bench_gpu.context(i, group.sets, SHAPE[1], case.per_sample)
        y = ref_rx.decode(ref_tx.encode(xs[i % group.sets], ctx), SHAPE, torch.float32, ctx)
        assert torch.equal(outputs[i], y), i
    if case.per_sample:
        assert bench_gpu.same_state(sender, receiver) is True
        if case.codec == "delta":   # the decode is the sender's own reconstruction (its
            # dense cache after the message; delta-lowbits caches it requantised)
            ids = bench_gpu.context(calls - 1, group.sets, SHAPE[1], True).sample_ids
            slots = torch.tensor([sender.cache.slots[int(i)] for i in ids])
            assert torch.equal(outputs[-1], sender.cache.read(slots).transpose(0, 1))
        # and the check sees a receiver that skipped a message
        late = case.make()
        for i in range(1, calls):
            late.decode(payloads[i], SHAPE, torch.float32,
                        bench_gpu.context(i, group.sets, SHAPE[1], True))
        assert bench_gpu.same_state(sender, late) is False
    else:
        assert bench_gpu.same_state(sender, receiver) is None


def test_time_calls_runs_every_call_once_in_order_and_holds_outputs():
    seen, host = [], []
    ms = bench_gpu.time_calls(lambda i: seen.append(i) or torch.zeros(1), 4, 3,
                              torch.device("cpu"), hold=2, host=host)
    assert seen == list(range(7)) and ms >= 0
    assert host == [ms]   # on the CPU issuing a call is running it


def test_rotation_exceeds_the_l2_cache_within_memory():
    mb = 2**20
    assert bench_gpu.rotation(31_457_280, 256 * mb) == 9      # (1024, 8, 1920) bf16
    assert bench_gpu.rotation(402_653_184, 256 * mb) == 4     # (1024, 8, 12288) fp32
    assert bench_gpu.rotation(160 * 1024, 256 * mb) == 1639   # coefficients: 256 MB of them
    assert bench_gpu.rotation(2 << 30, 256 * mb) == 2         # capped at 4 GiB in all
    assert bench_gpu.rotation(8192, 0) == 4
    for n in (31_457_280, 125_829_120, 402_653_184):
        k = bench_gpu.rotation(n, 256 * mb)
        assert k >= 4 and k * n >= 256 * mb


def test_cpu_smoke_wants_small_arguments(capsys):
    with pytest.raises(SystemExit):
        bench_gpu.main(["--device", "cpu", "--shapes", "64,2"])
    assert "--shapes: expected S,B,H" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_gpu.main(["--dtypes", "fp8"])


def test_speeds_from_the_committed_h200_run_reproduce_the_planners_table(tmp_path):
    """codec_speeds_h200.json is the --speeds-from derivation of the committed H200 run."""
    out = tmp_path / "speeds.json"
    src = "bench/results/gpu_h200_2026-11-26/bench_gpu.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert bench_gpu.main(["--speeds-from", src, "--json", str(out)]) == 0
    mine = json.loads(out.read_text())
    committed = json.loads(open(codec_speeds.DEFAULT_GPU_FILE).read())
    assert mine["codec_throughput_gbs"] == committed["codec_throughput_gbs"]
    assert mine["rows"] == committed["rows"] and mine["derived"] == committed["derived"]
    assert committed["measured"]["date"] == "2026-11-26" and \
        "gpu-check" in committed["measured"]["command"]
    assert committed["source"] == src and committed["device"] == "NVIDIA H200"
    # the old rows' fixpoint: 14.8 GB/s at (1024, 8, 1920) bf16, as timed there
    row = committed["rows"]["fixpoint"][0]
    assert (row["shape"], row["dtype"]) == ("(1024, 8, 1920)", "bfloat16")
    assert row["gbs"] == pytest.approx(1024 * 8 * 1920 * 2 / ((2.0860448837280274 +
                                                                0.037939199805259706) * 1e6))
