"""The one place that bridges the megatron-core releases we support: 0.16.1 (Python 3.11) and
0.19.x (Python 3.12). Callers import a name from here; nothing else branches on the release,
and everything here is detected by feature, not by version number. `UPSTREAM` lists what is
relied on; tests/test_compat.py fails when an upgrade renames or re-signs one of them.

It lives in the driver, not in megatron/cc/common/compat.py (torch's renames): megatron/cc never
imports megatron-core, and the notice filters must be in place before megatron.core is first
imported, which megatron/training/__init__.py guarantees. What differs between the releases:
docs/running.md.
"""
import dataclasses
import logging
import warnings

# (module, name, parameters the callers pass by name): each must exist upstream with them.
# A tuple of names: the first that exists is used (newer name first).
UPSTREAM = [
    ("megatron.core.transformer", "TransformerConfig",
     (("cuda_graph_modules", "cuda_graph_scope"),)),
    ("megatron.core.models.gpt", "GPTModel",
     ("config", "transformer_layer_spec", "vocab_size", "max_sequence_length", "pre_process",
      "post_process", "parallel_output", "share_embeddings_and_output_weights",
      "position_embedding_type", "rotary_percent", "rotary_base", "vp_stage")),
    ("megatron.core.distributed", "DistributedDataParallelConfig",
     ("grad_reduce_in_fp32", "overlap_grad_reduce", "use_distributed_optimizer",
      "overlap_param_gather", "bucket_size")),
    ("megatron.core.optimizer", "OptimizerConfig",
     ("optimizer", "sgd_momentum", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2",
      "adam_eps", "clip_grad", "bf16", "fp16", "params_dtype", "use_distributed_optimizer",
      "overlap_param_gather")),
    ("megatron.core.parallel_state", "initialize_model_parallel",
     ("tensor_model_parallel_size", "pipeline_model_parallel_size",
      "virtual_pipeline_model_parallel_size", "distributed_timeout_minutes")),
    ("megatron.core.parallel_state", "get_embedding_group", ("check_initialized",)),
]

# Start-up notices of upstream code paths this project does not take: GPTModel's deprecation
# notice, cpp_extension's missing CUDA runtime, the experimental MimoModel's config warning.
_LOGGED = (("megatron.core.models.gpt.gpt_model", "GPTModel IS DEPRECATED"),
           ("torch.utils.cpp_extension", "No CUDA runtime is found"))
_WARNED = (r"MimoModelConfig is experimental",)


class _Drop(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record):
        return self.text not in record.getMessage()


def quiet_upstream_notices() -> None:
    """Drop exactly the notices above; any other warning or log line still shows. Idempotent;
    must run before megatron.core is imported (megatron/training/__init__.py)."""
    for logger_name, text in _LOGGED:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _Drop) and f.text == text for f in logger.filters):
            logger.addFilter(_Drop(text))
    for message in _WARNED:
        warnings.filterwarnings("ignore", message=message, category=UserWarning,
                                module=r"megatron\.core(\.|$)")


def transformer_config_kwargs() -> dict:
    """Capture the whole layer if CUDA graphs are ever on: the empty list, which both releases
    read so, instead of the deprecated "full" default they warn about."""
    from megatron.core.transformer import TransformerConfig
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    return {"cuda_graph_modules" if "cuda_graph_modules" in names else "cuda_graph_scope": []}


def mlp_submodules(layer_spec):
    """The MLPSubmodules (linear_fc1, linear_fc2) of a GPT layer spec's mlp slot: a ModuleSpec
    in 0.16, a functools.partial of MLP.as_mlp_submodule in 0.19."""
    mlp = layer_spec.submodules.mlp
    sub = getattr(mlp, "submodules", None)
    return sub if sub is not None else mlp.keywords["submodules"]


def optimizer_parts(optimizer) -> list:
    """The optimizers inside megatron-core's `optimizer`: a ChainedOptimizer's parts, or the
    optimizer itself (get_megatron_optimizer returns either, by release and param groups)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))
