"""--torch-compile: every transformer layer of megatron-core's model under torch.compile.

Without Transformer Engine or apex, megatron-core's layer runs its layer norms, dropouts and
residual adds as kernels of their own (bias-GeLU and bias-dropout-add are fused on GPUs);
inductor fuses the chains between the matrix products. The layers stay megatron-core's modules
(names, parameters, checkpoints, hooks unchanged): each is compiled in place with
nn.Module.compile. The layers share their code, so one compilation serves them all; the
recompile limit is raised to the number of layers so that a layer whose guards differ (its own
layer number, say) is compiled too rather than left eager.
"""
from __future__ import annotations

import torch


def compile_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """Compile every TransformerLayer inside `model` in place; returns how many."""
    from megatron.core.transformer.transformer_layer import TransformerLayer
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), 2 * len(layers) + 8))
    for layer in layers:
        layer.compile(backend=backend)
    return len(layers)
