"""The dp channel's registry: every --dp-mode is one plug-in whose fields are flags of
CompressionConfig, whose owned flags are refused with another mode, and whose alias is
stored under one name."""
import dataclasses

import pytest

from megatron.cc.config import CompressionConfig
from megatron.cc.common.config_fields import ConfigError
from megatron.cc.data_parallel.registry import ALIASES, DP_MODES
from megatron.training.flags.arguments import build_parser, parse_args


def test_every_mode_and_alias_is_a_choice_and_resolves_to_its_plugin():
    choices = next(a for a in build_parser()._actions if a.dest == "dp_mode").choices
    assert set(choices) == set(DP_MODES) | set(ALIASES)
    assert CompressionConfig(dp_mode="cocktail").dp_mode == "cocktail_sgd"
    for name, plugin in DP_MODES.items():
        assert CompressionConfig(dp_mode=name).dp_plugin is plugin


def test_plugin_fields_are_flat_flags_with_help():
    names = {f.name for f in dataclasses.fields(CompressionConfig)}
    for plugin in DP_MODES.values():
        for f in dataclasses.fields(plugin):
            assert f.name in names and f.metadata["help"]


@pytest.mark.parametrize("owner", [n for n, m in DP_MODES.items() if m.owned()])
def test_owned_flags_are_refused_with_another_mode(owner):
    plugin = DP_MODES[owner]
    other = next(n for n, m in DP_MODES.items() if m.syncs_parameters and n != owner
                 and not set(plugin.owned()) & set(m.owned()))
    for name in plugin.owned():
        f = CompressionConfig.__dataclass_fields__[name]
        d = f.default   # a valid value other than the default
        value = True if isinstance(d, bool) else (d * 2 or 1) if isinstance(d, int) else \
            (d / 2 or 0.5) if isinstance(d, float) else (f.metadata["choices"] or ["fp16"])[-1]
        flag = "--" + name.replace("_", "-")
        argv = ["--dp-mode", other, flag] if value is True else \
            ["--dp-mode", other, flag, str(value)]
        with pytest.raises(ConfigError, match=f"{flag} configures --dp-mode"):
            parse_args(argv, world_size=2)
