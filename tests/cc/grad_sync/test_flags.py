"""The SC / FE flags: spellings, defaults, and the contradictions that are refused."""
import pytest

from megatron.cc.config import CompressionConfig
from megatron.cc.data_parallel.allreduce import AllReduce
from megatron.cc.embedding.fused import FusedEmbedding
from megatron.training.config.config_flags import ConfigError, add_dataclass_flags, from_namespace


def parse(argv):
    import argparse
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, CompressionConfig, "compression")
    return from_namespace(CompressionConfig, parser.parse_args(argv))


def test_defaults():
    c = parse([])
    assert (c.grad_comp, c.grad_comp_rank, c.grad_comp_warm_up) == (False, 128, 0.1)
    assert (c.selective_grad_comp, c.selective_grad_comp_way, c.emb_comm_opt) == (False, None, False)
    assert c.of(AllReduce).compressed_stages(4) == 0


@pytest.mark.parametrize("spelling", ["dash", "underscore"])
def test_optimus_cc_spellings(spelling):
    flags = ["--grad-comp", "--grad-comp-rank", "16", "--grad-comp-warm-up", "0.2",
             "--selective-grad-comp", "--selective-grad-comp-way", "3", "--emb-comm-opt"]
    if spelling == "underscore":
        flags = ["--" + f[2:].replace("-", "_") if f.startswith("--") else f for f in flags]
    c = parse(flags)
    c.validate(pp=4, dp=2, tp=1)
    assert (c.grad_comp_rank, c.grad_comp_warm_up, c.selective_grad_comp_way) == (16, 0.2, 3)
    assert c.emb_comm_opt and c.of(AllReduce).compressed_stages(4) == 3


def test_compressed_stages():
    c = CompressionConfig(grad_comp=True)
    assert c.of(AllReduce).compressed_stages(4) == 4                      # every stage
    c = CompressionConfig(grad_comp=True, selective_grad_comp=True)
    assert c.of(AllReduce).compressed_stages(4) == 3 and c.of(AllReduce).compressed_stages(1) == 1   # default pp - 1
    c = CompressionConfig(grad_comp=True, selective_grad_comp=True, selective_grad_comp_way=2)
    assert c.of(AllReduce).compressed_stages(4) == 2
    # Optimus-CC compresses stage s when s < way: a way above pp means every stage
    c = CompressionConfig(grad_comp=True, selective_grad_comp=True, selective_grad_comp_way=5)
    c.validate(pp=4, dp=2, tp=1)
    assert c.of(AllReduce).compressed_stages(4) == 4 and c.of(AllReduce).compressed_stages(2) == 2


def test_error_feedback_with_sc_alone_is_powersgd_error_feedback():
    """README section C of Optimus-CC: --grad_comp ... --use_error_feedback without CB."""
    c = CompressionConfig(grad_comp=True, use_error_feedback=True, selective_grad_comp=True,
                          selective_grad_comp_way=3)
    c.validate(pp=4, dp=2, tp=1)
    assert not c.compressed_backprop and c.of(AllReduce).compressed_stages(4) == 3


@pytest.mark.parametrize("fields,pp,message", [
    (dict(selective_grad_comp=True), 4, "--selective-grad-comp.*--grad-comp"),
    (dict(grad_comp=True, selective_grad_comp=True, selective_grad_comp_way=0), 4,
     "--selective-grad-comp-way 0"),
    (dict(grad_comp=True, grad_comp_rank=0), 2, "--grad-comp-rank"),
    (dict(grad_comp=True, grad_comp_warm_up=1.0), 2, "--grad-comp-warm-up"),
    (dict(grad_comp=True, grad_comp_warm_up=-0.1), 2, "--grad-comp-warm-up"),
    (dict(use_error_feedback=True), 2, "--use-error-feedback.*add --inter-grad-comp or --grad-comp"),
    (dict(inter_grad_comp=True, lep_flush_on_uncompressed=True), 2,
     "--lep-flush-on-uncompressed.*add --use-error-feedback"),
    (dict(lep_flush_on_uncompressed=True), 2, "--lep-flush-on-uncompressed.*--inter-grad-comp"),
])
def test_contradictions_are_refused(fields, pp, message):
    with pytest.raises(ConfigError, match=message):
        CompressionConfig(**fields).validate(pp=pp, dp=2, tp=1)


def test_fe_with_one_stage_is_allowed():
    """--emb-comm-opt at pipeline size 1 is accepted and, as its help says, changes nothing:
    FE is off, the emb channel is the plain sum, and every channel's predicted bytes equal
    those without the flag (at pp 2, where FE is on, they differ: the comparison can fail)."""
    from types import SimpleNamespace
    from megatron.cc.embedding.registry import build_emb_channel
    from megatron.cc.grad_sync.sync import EmbeddingSync
    from megatron.cc.plan.channel_bytes import channel_bytes
    from megatron.cc.plan.shapes import Layout, ModelShape
    from megatron.cc.common.stats import ChannelStats
    fe, plain = CompressionConfig(emb_comm_opt=True), CompressionConfig()
    assert fe.validate(pp=1, dp=2, tp=2) is None   # allowed: no ConfigError
    help_text = FusedEmbedding.__dataclass_fields__["emb_comm_opt"].metadata["help"]
    assert "pipeline size 1" in help_text and "changes nothing" in help_text   # documented
    assert not fe.fused_embedding(1) and fe.fused_embedding(2)
    topo = SimpleNamespace(emb_group="emb group")
    emb = build_emb_channel(fe, topo, ChannelStats(), None, pp=1)
    assert type(emb) is EmbeddingSync and emb.group == "emb group"
    shape = ModelShape(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=1000,
                       seq_length=16)
    one, two = Layout(tp=2, pp=1, dp=2), Layout(tp=2, pp=2, dp=2)
    assert channel_bytes(shape, one, fe) == channel_bytes(shape, one, plain)
    assert channel_bytes(shape, two, fe)["dp"] != channel_bytes(shape, two, plain)["dp"]
