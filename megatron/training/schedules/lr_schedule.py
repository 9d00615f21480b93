"""The learning-rate schedule: megatron-core's OptimizerParamScheduler built from the run's
flags, and the learning rate it gives every iteration (for rules that place DiLoCo's syncs by
it, --diloco-sync-steps lr<p>:<K>)."""
from types import SimpleNamespace
from typing import List

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


def sample_based(args) -> bool:
    """--train-samples: the schedule counts samples, stepped by the global batch."""
    return args.compat.train_samples is not None


def build_scheduler(args, optimizer) -> OptimizerParamScheduler:
    a, c = args.training, args.compat
    decay_iters = a.lr_decay_iters or a.train_iters
    warmup = (int(a.lr_warmup_fraction * decay_iters) if a.lr_warmup_fraction is not None
              else a.lr_warmup_iters)
    if sample_based(args):   # Megatron's sample-based schedule, stepped by batch
        decay_iters = c.lr_decay_samples or c.train_samples
        warmup = (int(a.lr_warmup_fraction * decay_iters) if a.lr_warmup_fraction is not None
                  else c.lr_warmup_samples)
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0 if warmup else a.lr, max_lr=a.lr, min_lr=a.min_lr,
        lr_warmup_steps=warmup, lr_decay_steps=decay_iters,
        lr_decay_style=a.lr_decay_style, start_wd=a.weight_decay, end_wd=a.weight_decay,
        wd_incr_steps=decay_iters, wd_incr_style="constant")


def lr_per_iteration(args, global_batch_size: int) -> List[float]:
    """The learning rate of iterations 0 .. train_iters - 1, as training steps the schedule
    (after each optimizer step, by 1 or by the global batch when sample-based)."""
    group = {}
    sched = build_scheduler(args, SimpleNamespace(param_groups=[group]))
    increment = global_batch_size if sample_based(args) else 1
    out = []
    for _ in range(args.training.train_iters):
        out.append(group["lr"])
        sched.step(increment)
    return out
