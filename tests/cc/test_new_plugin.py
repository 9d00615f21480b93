"""Adding a method is one file in its channel's package plus one registry line.

The smallest shipped methods are that already (fixpoint.py for the pipeline, adpsgd.py for
dp: named nowhere in megatron/ but their file and their registry). A new pipeline codec and a
new dp mode, each written here as a module of its own and registered with one assignment,
become flags with help and bounds, a config section of their own, refusals naming their
flags, and a working link end / dp channel, without touching any other file."""
import importlib
import os
import textwrap
import tokenize

import pytest
import torch

from megatron.cc.codecs.base import CodecContext
from megatron.cc.common.config_fields import ConfigError
from megatron.cc.data_parallel.registry import DP_MODES, build_dp_channel
from megatron.cc.pipeline.registry import FWD, LinkEnd, pp_link
from megatron.training.flags.arguments import build_parser, parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "4"]

PP_METHOD = '''
from dataclasses import dataclass

from megatron.cc.codecs.fixpoint import FixpointCodec
from megatron.cc.common.config_fields import flag
from megatron.cc.pipeline.base import PpMethod


@dataclass
class WholeMessage(PpMethod):
    name = "wholemsg"
    quantises = True
    wholemsg_bits: int = flag(6, "Bits per value, one scale per message.", low=1, high=8)

    @staticmethod
    def codec(c, spec):
        return FixpointCodec(bits=c.wholemsg_bits, granularity="tensor",
                             stochastic=c.stochastic_rounding, seed=spec.seed,
                             scheme=c.quant_scheme)
'''

DP_MODE = '''
from dataclasses import dataclass

from megatron.cc.common.config_fields import flag
from megatron.cc.data_parallel.base import DpMode


@dataclass
class EveryOther(DpMode):
    name = "every_other"
    every_other_period: int = flag(2, "Average the replicas' weights every this many steps.",
                                   low=1)

    @staticmethod
    def build(c, topo, stats, run):
        return ("every_other", c.every_other_period, topo.dp_group)
'''


def _module(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.mark.parametrize("cls, file, registry", [
    ("Fixpoint", "megatron/cc/pipeline/fixpoint.py", "megatron/cc/pipeline/registry.py"),
    ("ADPSGD", "megatron/cc/data_parallel/adpsgd.py", "megatron/cc/data_parallel/registry.py")])
def test_the_smallest_methods_are_their_file_and_their_registry_line(cls, file, registry):
    named = []   # (file, line) of every use of the class's name in code (not in text)
    for folder, _, files in os.walk(os.path.join(ROOT, "megatron")):
        for f in files:
            path = os.path.relpath(os.path.join(folder, f), ROOT)
            if f.endswith(".py") and path != file:
                with open(os.path.join(ROOT, path), "rb") as fh:
                    named += [(path, t.start[0]) for t in tokenize.tokenize(fh.readline)
                              if t.type == tokenize.NAME and t.string == cls]
    assert [p for p, _ in named] == [registry, registry], named   # its import, its entry
    assert len(open(os.path.join(ROOT, file)).read().splitlines()) <= 20


def test_a_new_pipeline_codec_is_one_file_and_one_registry_line(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "wholemsg_plugin", PP_METHOD)
    monkeypatch.setitem(FWD, "wholemsg", mod.WholeMessage)   # the registry line

    help_text = build_parser().format_help()
    assert "--wholemsg-bits" in help_text and "wholemsg" in help_text
    pp2 = BASE + ["--pipeline-model-parallel-size", "2", "--forward-compress-method",
                  "wholemsg"]
    args = parse_args(pp2 + ["--wholemsg-bits", "3"], world_size=2)
    c = args.compression
    assert c.of(mod.WholeMessage).wholemsg_bits == 3 == c.wholemsg_bits
    assert args.to_dict()["compression"]["wholemsg_bits"] == 3
    with pytest.raises(ConfigError, match="--wholemsg-bits must be in 1..8, got 9"):
        parse_args(pp2 + ["--wholemsg-bits", "9"], world_size=2)
    # the shared pipeline rules apply to it: pp 1 has no pipeline link
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-size 1"):
        parse_args(BASE + ["--forward-compress-method", "wholemsg"], world_size=2)

    link = pp_link(c, LinkEnd("pp-fwd", peer=1, sample_shape=(8, 16)))
    x = torch.randn(2, 8, 16)
    ctx = CodecContext()
    payload = link.codec.encode(x, ctx)
    y = link.codec.decode(payload, x.shape, x.dtype, ctx)
    assert y.shape == x.shape and 0 < (y - x).abs().max() < x.abs().max() / 2
    sent = sum(p.numel() * p.element_size() for p in payload)
    assert sent < x.numel() * x.element_size() / 4   # 3-bit codes and one scale


def test_a_new_dp_mode_is_one_file_and_one_registry_line(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "every_other_plugin", DP_MODE)
    monkeypatch.setitem(DP_MODES, "every_other", mod.EveryOther)   # the registry line

    assert "--every-other-period" in build_parser().format_help()
    args = parse_args(BASE + ["--dp-mode", "every_other", "--every-other-period", "5"],
                      world_size=2)
    c = args.compression
    assert c.dp_plugin is mod.EveryOther and c.of(mod.EveryOther).every_other_period == 5
    # its own flag given with another mode is refused, naming both
    with pytest.raises(ConfigError, match="--every-other-period configures --dp-mode "
                                          "every_other, but --dp-mode is allreduce"):
        parse_args(BASE + ["--every-other-period", "5"], world_size=2)
    with pytest.raises(ConfigError, match="--every-other-period must be >= 1"):
        parse_args(BASE + ["--dp-mode", "every_other", "--every-other-period", "0"],
                   world_size=2)

    class Topo:
        dp_group, dp_rank = "the dp group", 0
    assert build_dp_channel(c, Topo(), None, None) == ("every_other", 5, "the dp group")
