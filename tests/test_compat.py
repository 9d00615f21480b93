"""Each upstream name the compat modules rely on exists, with the parameters we pass, in the
installed torch and megatron-core: an upgrade that renames or re-signs one fails here by name
rather than deep inside a training run. Runs on both supported pairs (megatron-core 0.16.1 on
Python 3.11, 0.19.x on Python 3.12)."""
import dataclasses
import importlib
import inspect
import logging
import os
import warnings

import pytest
import torch.distributed as dist

from megatron.training.runtime import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _parameters(obj) -> set:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj) if f.init}
    return set(inspect.signature(obj).parameters)


@pytest.mark.parametrize("module,name,params", compat.UPSTREAM,
                         ids=[f"{m}.{n}" for m, n, _ in compat.UPSTREAM])
def test_megatron_core_names(module, name, params):
    obj = getattr(importlib.import_module(module), name, None)
    assert obj is not None, f"{module}.{name} is gone"
    have = _parameters(obj)
    for p in params:
        choices = p if isinstance(p, tuple) else (p,)
        assert have & set(choices), f"{module}.{name} takes none of {choices}"


@pytest.mark.parametrize("new,old,params", [
    ("all_gather_single", "all_gather_into_tensor", ("group", "async_op")),
    ("reduce_scatter_single", "reduce_scatter_tensor", ("op", "group", "async_op")),
])
def test_torch_collectives(new, old, params):
    fn = getattr(dist, new, None) or getattr(dist, old, None)
    assert fn is not None, f"torch.distributed has neither {new} nor {old}"
    sig = inspect.signature(fn).parameters
    assert all(p in sig for p in params), (fn.__name__, list(sig))
    assert len([p for p in sig if p not in params]) >= 2   # (output, input) positionally


def test_transformer_config_without_cuda_graph_warnings():
    from megatron.core.transformer import TransformerConfig
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                          **compat.transformer_config_kwargs())
    noise = [str(w.message) for w in caught
             if "cuda_graph" in str(w.message) or "full scope" in str(w.message)]
    assert not noise, noise


@pytest.mark.parametrize("logger_name,text", compat._LOGGED)
def test_notice_loggers(logger_name, text):
    """Where upstream has the notice (megatron-core 0.19: both; 0.16: cpp_extension's), it logs
    it through the filtered logger; only the one notice is dropped."""
    module = importlib.import_module(logger_name)
    if text in inspect.getsource(module):
        assert getattr(module, "logger", None) is logging.getLogger(logger_name)
    compat.quiet_upstream_notices()
    compat.quiet_upstream_notices()   # idempotent
    logger = logging.getLogger(logger_name)
    drops = [f for f in logger.filters if isinstance(f, compat._Drop) and f.text == text]
    assert len(drops) == 1
    assert not drops[0].filter(logging.makeLogRecord({"msg": f"x {text} y"}))
    assert drops[0].filter(logging.makeLogRecord({"msg": "another notice"}))


def test_this_repositorys_training_package():
    """megatron-core 0.17+ wheels ship a megatron/training package of their own; the
    repository's must be the one imported (pytest puts the checkout first on sys.path, as
    pretrain_gpt.py and tools/ do)."""
    import megatron.training
    assert os.path.dirname(os.path.abspath(megatron.training.__file__)) == \
        os.path.join(ROOT, "megatron", "training"), megatron.training.__file__


def test_mlp_submodules_of_the_local_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.mlp import MLPSubmodules
    sub = compat.mlp_submodules(get_gpt_layer_local_spec())
    assert isinstance(sub, MLPSubmodules) and sub.linear_fc1 is not None and sub.linear_fc2
