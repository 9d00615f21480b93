"""--optimizer muon: torch.optim.Muon (momentum orthogonalised by Newton-Schulz iterations) on
the hidden weight matrices, AdamW on everything else (word and position embeddings, the
output layer, norms, biases), the split Muon is meant for and Megatron-LM's own.

Both halves are megatron-core optimizers built by get_megatron_optimizer (so param groups,
weight-decay multipliers, fp32 main weights under --bf16 and the lr schedule are megatron's),
chained into one ChainedOptimizer whose step clips both by one global norm. Muon's inner torch
optimizer is swapped in over the param groups megatron built, as use_replica_adam swaps Adam.

Muon orthogonalises whole matrices: a tensor-parallel slice is not one, and the distributed
optimizer shards matrices across dp; both are refused at parse time (flags/arguments.py)
rather than run as something else. --muon-scale-mode match_rms_adamw (the default) scales each
update to AdamW's RMS, so --lr means what it means for Adam; spectral is Muon's own
max(1, rows/cols)^0.5.
"""
from typing import List

import torch

from megatron.cc.common.config_fields import ConfigError
from megatron.training.runtime.compat import optimizer_parts

# torch.optim.Muon's adjust_lr_fn for each --muon-scale-mode
SCALE_MODES = {"match_rms_adamw": "match_rms_adamw", "spectral": "original"}
# keys of AdamW's param groups that Muon has none of (megatron's own keys are kept)
_ADAM_KEYS = ("betas", "eps", "amsgrad", "foreach", "maximize", "capturable", "differentiable",
              "fused", "decoupled_weight_decay")


def is_muon_param(name: str, param: torch.nn.Parameter) -> bool:
    """A hidden weight matrix: 2-D, and neither an embedding nor the output layer."""
    return (param.ndim == 2 and not getattr(param, "is_embedding_or_output_parameter", False)
            and "embedding" not in name and "output_layer" not in name)


def _muon_groups(groups: List[dict]) -> List[dict]:
    return [{k: v for k, v in g.items() if k not in _ADAM_KEYS} for g in groups]


def build_muon_optimizer(opt_config, model, momentum: float = 0.95, ns_steps: int = 5,
                         scale_mode: str = "match_rms_adamw"):
    """ChainedOptimizer of Muon over model's hidden matrices and AdamW over the rest.
    `opt_config`: the megatron-core OptimizerConfig of the AdamW half (optimizer 'adam')."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer.optimizer import ChainedOptimizer
    if not hasattr(torch.optim, "Muon"):   # pyproject allows torch from 2.5; Muon is 2.9's
        raise ConfigError(f"--optimizer muon needs torch.optim.Muon (torch >= 2.9), and this "
                          f"torch is {torch.__version__}: upgrade torch or use --optimizer adam")
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = {id(p) for n, p in params if is_muon_param(n, p)}
    if not matrices:
        raise ConfigError("--optimizer muon: the model has no hidden weight matrix to train "
                          "with Muon; use --optimizer adam")
    # get_megatron_optimizer takes the parameters that require grad: build each half with the
    # other frozen, then restore
    try:
        for n, p in params:
            p.requires_grad_(id(p) in matrices)
        muon_half = optimizer_parts(get_megatron_optimizer(opt_config, [model]))
        for n, p in params:
            p.requires_grad_(id(p) not in matrices)
        adam_half = optimizer_parts(get_megatron_optimizer(opt_config, [model]))
    finally:
        for n, p in params:
            p.requires_grad_(True)
    for wrapper in muon_half:
        wrapper.optimizer = torch.optim.Muon(
            _muon_groups(wrapper.optimizer.param_groups), lr=opt_config.lr,
            weight_decay=opt_config.weight_decay, momentum=momentum, nesterov=True,
            ns_steps=ns_steps, adjust_lr_fn=SCALE_MODES[scale_mode])
    return ChainedOptimizer(muon_half + adam_half)
