"""The dp channel's registry: every --dp-mode is one plug-in whose fields are flags of
CompressionConfig, whose owned flags are refused with another mode, and whose alias is
stored under one name; CompressionConfig holds one instance per plug-in."""
import dataclasses

import pytest

from megatron.cc.config import CompressionConfig
from megatron.cc.common.config_fields import ConfigError, flag_fields
from megatron.cc.data_parallel.registry import DP_MODES
from megatron.training.flags.arguments import build_parser, parse_args


def test_every_mode_and_alias_is_a_choice_and_resolves_to_its_plugin():
    choices = next(a for a in build_parser()._actions if a.dest == "dp_mode").choices
    aliases = {a for m in DP_MODES.values() for a in m.aliases}
    assert aliases and set(choices) == set(DP_MODES) | aliases
    assert CompressionConfig(dp_mode="cocktail").dp_mode == "cocktail_sgd"
    for name, plugin in DP_MODES.items():
        assert CompressionConfig(dp_mode=name).dp_plugin is plugin


def test_plugin_fields_are_flat_flags_with_help_held_by_its_own_instance():
    names = [f.name for _, f in flag_fields(CompressionConfig)]
    assert len(names) == len(set(names))   # each flag declared once
    c = CompressionConfig(grad_comp_rank=7, diloco_outer_lr=0.3)
    for plugin in DP_MODES.values():
        for f in dataclasses.fields(plugin):
            assert f.name in names and f.metadata["help"]
            assert getattr(c.of(plugin), f.name) is getattr(c, f.name)
    assert c.of(DP_MODES["allreduce"]).grad_comp_rank == 7
    assert c.of(DP_MODES["diloco"]).diloco_outer_lr == 0.3
    c.diloco_outer_lr = 0.5   # a flat write lands in the plug-in's instance
    assert c.of(DP_MODES["diloco"]).diloco_outer_lr == 0.5
    with pytest.raises(TypeError, match="no field diloco_outer_lrr"):
        CompressionConfig(diloco_outer_lrr=1.0)


@pytest.mark.parametrize("owner", [n for n, m in DP_MODES.items() if m.owned()])
def test_owned_flags_are_refused_with_another_mode(owner):
    plugin = DP_MODES[owner]
    other = next(n for n, m in DP_MODES.items() if m.syncs_parameters and n != owner
                 and not set(plugin.owned()) & set(m.owned()))
    for name in plugin.owned():
        f = next(f for _, f in flag_fields(CompressionConfig) if f.name == name)
        d = f.default   # a valid value other than the default
        value = True if isinstance(d, bool) else (d * 2 or 1) if isinstance(d, int) else \
            (d / 2 or 0.5) if isinstance(d, float) else (f.metadata["choices"] or ["fp16"])[-1]
        flag = "--" + name.replace("_", "-")
        argv = ["--dp-mode", other, flag] if value is True else \
            ["--dp-mode", other, flag, str(value)]
        with pytest.raises(ConfigError, match=f"{flag} configures --dp-mode"):
            parse_args(argv, world_size=2)
