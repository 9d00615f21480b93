"""fp16 loss scaling as megatron-core's mixed-precision optimizer takes it, and its log field.

bf16 / fp16 runs train through megatron-core's Float16OptimizerWithFloat16Params: fp32 main
weights, gradients copied to them and unscaled, a step skipped (and counted in the log line)
when an fp16 gradient overflowed, the dynamic scale halving after `hysteresis` overflows and
doubling after `loss_scale_window` clean steps.
"""

from megatron.training.runtime.compat import optimizer_parts


def loss_scaling(gpu_args) -> dict:
    """OptimizerConfig fields for the loss scale (used by megatron-core for fp16 only)."""
    return dict(loss_scale=gpu_args.loss_scale, initial_loss_scale=gpu_args.initial_loss_scale,
                min_loss_scale=gpu_args.min_loss_scale,
                loss_scale_window=gpu_args.loss_scale_window, hysteresis=gpu_args.hysteresis)


def _grad_scaler(optimizer):
    chained = optimizer_parts(optimizer)
    return getattr(chained[0], "grad_scaler", None)


def loss_scaler(optimizer):
    """loss -> loss x scale before backward (Megatron's grad_scale_func), or None when no
    scaler runs (fp32, bf16): the optimizer divides the gradients by the same scale."""
    return None if _grad_scaler(optimizer) is None else optimizer.scale_loss


def loss_scale_field(optimizer) -> str:
    """' loss scale: S |' for fp16 runs (Megatron's log line), '' otherwise."""
    scaler = _grad_scaler(optimizer)
    if scaler is None:
        return ""
    return f" loss scale: {float(scaler.scale):.1f} |"   # a sync, at log intervals only
