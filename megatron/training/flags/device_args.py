"""GPU flags: attention implementation, loss scaling, megatron-core DDP options, transports.

Megatron-LM spellings throughout. Validation has no side effects and names the flag.
"""
from dataclasses import dataclass
from typing import Optional

from megatron.training.config.config_flags import ConfigError, flag

BACKENDS = ["nccl", "gloo"]


@dataclass
class GpuArgs:
    transformer_impl: Optional[str] = flag(
        None, "Attention/layer implementation: local (unfused, megatron-core), sdpa (torch "
              "scaled_dot_product_attention: flash kernels), transformer_engine (if installed; "
              "its parameter names are not mapped by tools/checkpoint). Default: sdpa on GPUs, "
              "local on CPU.",
        choices=["local", "sdpa", "transformer_engine"])
    loss_scale: Optional[float] = flag(
        None, "--fp16: a constant loss scale (a power of two); default dynamic scaling.")
    initial_loss_scale: float = flag(2.0 ** 32, "--fp16: initial dynamic loss scale.")
    min_loss_scale: float = flag(1.0, "--fp16: floor of the dynamic loss scale.")
    loss_scale_window: int = flag(
        1000, "--fp16: iterations without overflow before the dynamic scale doubles.")
    hysteresis: int = flag(2, "--fp16: overflows tolerated before the dynamic scale halves.")
    use_distributed_optimizer: bool = flag(
        False, "Shard the optimizer state over data-parallel ranks (megatron-core's "
               "distributed optimizer; exact dp mode only). Checkpoints gather it: resumable "
               "at any dp size, with or without this flag.")
    overlap_param_gather: bool = flag(
        False, "With --use-distributed-optimizer: overlap the parameter all-gather with the "
               "next forward.")
    torch_compile: bool = flag(
        False, "Compile every transformer layer with torch.compile (inductor): layer norms, "
               "dropouts, bias adds and GeLU fused; megatron-core's modules, names and "
               "checkpoints unchanged. Costs a compilation at the first iterations.")
    # --overlap-grad-reduce is ParallelArgs': our own dp channels (exact, PowerSGD) overlap
    # --dp-backend (the dp channel's transport) is CompressionConfig's: it serves every dp mode
    pp_backend: Optional[str] = flag(
        None, "Transport of the pipeline channels: nccl or gloo (CUDA tensors are staged "
              "through pinned host buffers); default the --distributed-backend.",
        choices=BACKENDS)

    def validate(self, fp16: bool) -> None:
        scaling = {"loss_scale": None, "initial_loss_scale": 2.0 ** 32, "min_loss_scale": 1.0,
                   "loss_scale_window": 1000, "hysteresis": 2}
        for name, default in scaling.items():
            if not fp16 and getattr(self, name) != default:
                raise ConfigError(f"--{name.replace('_', '-')} sets fp16 loss scaling; add "
                                  f"--fp16 (bf16 and fp32 need no loss scale)")
        if self.loss_scale is not None and self.loss_scale <= 0:
            raise ConfigError(f"--loss-scale must be > 0, got {self.loss_scale}")
        if self.min_loss_scale <= 0 or self.initial_loss_scale < self.min_loss_scale:
            raise ConfigError(f"need 0 < --min-loss-scale ({self.min_loss_scale}) <= "
                              f"--initial-loss-scale ({self.initial_loss_scale})")
        if self.loss_scale_window < 1 or self.hysteresis < 1:
            raise ConfigError("--loss-scale-window and --hysteresis must be >= 1")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
        if self.transformer_impl == "transformer_engine":
            from megatron.training.model.attention import have_transformer_engine
            if not have_transformer_engine():
                raise ConfigError("--transformer-impl transformer_engine: the transformer_engine "
                                  "package is not installed; use sdpa or local")


def validate_gpu_args(args) -> None:
    """Cross-group rules: the options megatron-core's DDP handles itself need the exact dp mode
    (our compressed / fused gradient channels replace its all-reduce)."""
    g, c = args.gpu, args.compression
    g.validate(args.model.fp16)
    from megatron.training.runtime.topology import cuda_available  # torch: only when asked
    for flag, backend, gpus in (("pp", g.pp_backend, "CUDA GPUs"), ("dp", c.dp_backend, "GPUs")):
        if backend == "nccl" and not cuda_available():
            raise ConfigError(f"--{flag}-backend nccl needs {gpus}; use gloo on CPU")
    ddp_owned = g.use_distributed_optimizer
    if ddp_owned and args.dp > 1 and args.parallel.distributed_backend == "gloo" \
            and cuda_available():
        # its parameter all-gather after the step coalesces CUDA tensors, which gloo cannot
        # (megatron-core's start_param_sync crashes)
        raise ConfigError("--use-distributed-optimizer with --distributed-backend gloo on GPUs: "
                          "megatron-core's parameter all-gather needs NCCL there; use "
                          "--distributed-backend nccl (one rank per GPU) or drop the flag")
    if ddp_owned and c.dp_mode != "allreduce":
        raise ConfigError(f"--dp-mode {c.dp_mode} exchanges its own state between the replicas, "
                          f"which --use-distributed-optimizer's sharded step does not follow; "
                          f"use --dp-mode allreduce (with --grad-comp to compress it) or drop "
                          f"--use-distributed-optimizer")
    if ddp_owned and c.dp_backend is not None:
        raise ConfigError("--dp-backend gives the dp channel its own group, which megatron-core's "
                          "own gradient sync (--use-distributed-optimizer) "
                          "does not use; drop one")
