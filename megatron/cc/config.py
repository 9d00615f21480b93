"""Configuration of every compression channel (fwd, bwd, dp, emb), one dataclass; the dp
channel's fields come from its plug-ins (megatron/cc/dp_modes/, one file per --dp-mode).

The library (megatron.cc) receives this object in constructors and never reads flags itself;
the training driver generates the flags from these fields (megatron.training.config_flags).
"""
import os
from dataclasses import dataclass
from typing import Optional

from megatron.cc.config_fields import ConfigError, flag
from megatron.cc.dp_modes import DpConfig


@dataclass
class CompressionConfig(DpConfig):
    check_comp_ratio: bool = flag(
        False, "Log bytes sent per channel and the ratio against uncompressed bytes "
               "(always counted; this also prints a per-channel summary at the end).")
    check_comp_speed: bool = flag(
        False, "Log compression / decompression speed per channel on the log line (GB/s of "
               "uncompressed bytes, mean over messages and ranks; codec compute only, not the "
               "collectives): every pipeline codec, --grad-comp-type RandomizedSVD and "
               "--emb-grad-comp. CUDA events read once complete (no sync); wall clock on CPU.")
    comp_seed: Optional[int] = flag(
        None, "Seed of the low-rank compressors' random draws, equal on every rank: the "
              "initial Q of CB, of --grad-comp's PowerSGD and of --emb-grad-comp, and the "
              "RandomizedSVD projections. Default: --seed (Optimus-CC: 714, independent of "
              "--seed). Saved in checkpoints; a resume must keep it.")

    # ---- --compression auto: the planner chooses the codecs
    #      (megatron/training/auto_compression.py)
    compression: str = flag(
        "manual", "manual: the compression flags given (today's behaviour). auto: at start-up "
                  "probe every channel's link (bandwidth, latency) and the compute rate, run the "
                  "planner of tools/plan_compression.py on the launched tp/pp/dp layout, print "
                  "the plan and train with its fastest candidate within --quality-budget "
                  "(codecs, dp mode and --overlap-* flags; give none of them by hand).",
        choices=["manual", "auto"])
    quality_budget: float = flag(
        2.0, "--compression auto: largest expected validation-loss gap in percent "
             "(megatron/cc/plan/quality.py's measured gaps; unmeasured schemes are left out).")

    # ---- fwd channel (+ direct bwd quantisation): AC-SGD / AQ-SGD and TAH-Quant
    forward_compress_method: str = flag(
        "none", "Codec of the activations sent forward between pipeline stages: fixpoint "
                "(b-bit, one scale per hidden channel), delta / delta-lowbits (AC-SGD: the b-bit "
                "change against a per-sample activation cache kept on both ends), tah "
                "(TAH-Quant), subspace (Subspace Networks: the subspace-constrained model "
                "sends --subspace-rank coefficients per token both ways; see "
                "megatron/training/subspace.py). Validation passes always send uncompressed.",
        choices=["none", "fixpoint", "delta", "delta-lowbits", "tah", "subspace"])
    forward_bits: int = flag(4, "Bits per value of fixpoint / delta activations (1..8).")
    forward_bits_act: int = flag(
        8, "delta-lowbits: bits per value of the cached activations (1..8), one 16-bit scale "
           "per (sample, channel) as AC-SGD (whose default is 4).")
    max_activation_cache_size: Optional[int] = flag(
        None, "delta*: samples each activation cache holds (least recently used evicted "
              "beyond). Default: every training sample the replica will see. Each rank holds "
              "one cache per link end; the size is printed at start-up and a cache that does "
              "not fit is refused.")
    activation_cache_location: str = flag(
        "ram", "delta*: 'ram' (host memory; pinned, with asynchronous copies, when training "
               "on GPUs), 'device' (GPU memory), or 'disk:DIR' for memory-mapped files in the "
               "existing directory DIR (one per cache, deleted at exit).")
    activation_cache_dtype: str = flag(
        "fp16", "delta: element type of the activation cache (AC-SGD's fp16 by default: half "
                "fp32's memory, same loss as fp32 measured, since each delta is taken against "
                "the rounded copy both ends hold; values saturate at +-65504). bf16: same "
                "memory, fp32's range; fp32: twice the memory. Both ends round alike, so their "
                "caches stay identical. (delta-lowbits stores --forward-bits-act bits instead.)",
        choices=["fp32", "fp16", "bf16"])
    tile_size: int = flag(64, "tah: tile width along the hidden dim (a power of two, 2..256).")
    high_precision_bits: int = flag(4, "tah: bits of the high-entropy tokens (1..8).")
    low_precision_bits: int = flag(3, "tah: bits of the other tokens (1..8).")
    high_precision_allocation_ratio: float = flag(
        0.8, "tah: share of tokens (highest entropy first) that get --high-precision-bits.")
    # ---- Subspace Networks (megatron/training/subspace.py validates and builds them)
    subspace_rank: Optional[int] = flag(
        None, "k of the subspace-constrained model: every attention / MLP output projection "
              "writes into one shared k-dim subspace of the residual stream. With "
              "--forward-compress-method subspace (default k 10) stage boundaries carry k "
              "coefficients per token both ways; alone (any pp, pp 1 included) it builds the "
              "constrained model and sends whole activations.")
    subspace_bits: Optional[int] = flag(
        None, "--forward-compress-method subspace: bits per coefficient on the wire, both "
              "directions: 1..8 = fixpoint (one 16-bit scale per coefficient and message), "
              "0 = unquantised (the exact messages). Default 4: with k 10 at hidden 128, "
              "40 bits a token against fp32's 4096, x100.8 both ways at the demo's shape.")
    backward_compress_method: str = flag(
        "none", "Codec of the activation gradients sent back: fixpoint (b-bit, no error "
                "feedback) or lowrank (Optimus-CC CB, the same as --inter-grad-comp, with "
                "its --inter-grad-comp-* / --use-error-feedback modifiers).",
        choices=["none", "fixpoint", "lowrank"])
    backward_bits: int = flag(8, "Bits per value of fixpoint gradients (1..8).")
    backward_tile_size: Optional[int] = flag(
        None, "fixpoint gradients: one scale per tile of this many hidden values (a power of "
              "two; TAH-Quant runs 32); default one scale per hidden channel.")
    backward_rank: Optional[int] = flag(
        None, "lowrank gradients: rank r of the CB factors; default --inter-grad-comp-rank.")
    stochastic_rounding: bool = flag(
        False, "fixpoint / delta quantisers round stochastically (unbiased) instead of to "
               "nearest; the generators are in the checkpoint.")
    quant_scheme: str = flag(
        "fitted", "Grid and scale of every b-bit quantiser (fixpoint / delta activations and "
                  "gradients, CocktailSGD values, the dp modes' int8 / fixpoint-b): fitted "
                  "(every one of the 2^b codes, symmetric, each group's scale chosen to minimise "
                  "its squared error; 1 bit = sign x mean|x|), absmax (the same grid with the "
                  "scale = max|x|: nothing clipped, |error| <= step/2), or seed (the AC-SGD / "
                  "CocktailSGD grid: 2^b codes from -2^(b-1) to 2^(b-1)-1 times max|x|/2^(b-1); "
                  "1 bit = sign x RMS). Stochastic rounding always scales by max|x|.",
        choices=["fitted", "absmax", "seed"])
    warmup_epochs: float = flag(
        0.0, "Pipeline channels send uncompressed (activation caches fill) for this many "
             "epochs of the training split; converted to whole iterations.")
    compress_warmup_iters: int = flag(
        0, "The same warm-up counted in iterations (give this or --warmup-epochs).")

    # ---- bwd channel: Optimus-CC compressed backpropagation (CB) + lazy error propagation
    inter_grad_comp: bool = flag(
        False, "Compress the activation gradients sent back between pipeline stages with one "
               "PowerSGD step (low-rank P, Q; Q warm-started across messages).")
    inter_grad_comp_rank: int = flag(12, "Rank r of the CB factors (paper runs 16). Ratio in "
                                         "elements = n*m / (r*(n+m)); r >= min(n, m) is exact.")
    inter_grad_comp_power_iters: int = flag(
        1, "Power steps per CB message (ours; the paper does 1). Each extra step costs two "
           "local matmuls on the sender and no bytes, and brings P Q^T closer to the best "
           "rank-r approximation of the gradient.")
    inter_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward sends go uncompressed.")
    inter_grad_comp_epilogue_only: bool = flag(
        False, "Compress only the backward sends on 1F1B's critical path: the last send of the "
               "steady phase and every send of the cool-down. Both ends decide from (stage, "
               "micro-batch, pp, M) alone.")
    inter_grad_comp_dtype: Optional[str] = flag(
        None, "dtype of P and Q on the wire (float32|bfloat16|float16); default: the "
              "gradient's dtype, so the byte ratio equals the element ratio.",
        choices=["float32", "bfloat16", "float16"])
    inter_grad_comp_type: str = flag(
        "PowerSGD", "CB codec: PowerSGD (the 'lowrank' codec, Q warm-started across messages) "
                    "or RandomizedSVD (the 'rsvd' codec: a fresh Gaussian projection per "
                    "message, seeded by --comp-seed, iteration and micro-batch; "
                    "--inter-grad-comp-power-iters - 1 subspace iterations). Same bytes. "
                    "Optimus-CC accepts this flag and always runs PowerSGD.",
        choices=["PowerSGD", "RandomizedSVD"])
    use_error_feedback: bool = flag(
        False, "Lazy error propagation for CB: the sender keeps E = M - P Q^T and adds it to the "
               "next message (across micro-batches and iterations); E is never sent alone. "
               "With --grad-comp and no CB it is Optimus-CC's PowerSGD error feedback, which "
               "--grad-comp always applies here.")
    lep_flush_on_uncompressed: bool = flag(
        False, "LEP: when a backward send goes uncompressed (the steady phase under "
               "--inter-grad-comp-epilogue-only, or CB warm-up), add the pending error E to it "
               "and send it exactly (E <- 0) instead of holding E for the next compressed send.")
    check_orth_error_acti: bool = flag(
        False, "Optimus-CC Fig. 11 diagnostic: on the last stage, log the cosine between the "
               "LEP error and the change of the stage's input activation between consecutive "
               "micro-batches, and the mean magnitude of both.")

    # ---- emb channel: Optimus-CC fused embedding synchronisation (FE)
    emb_comm_opt: bool = flag(
        False, "Fused embedding sync: the tied embedding gradient takes one all-reduce over "
               "the first and last stage of every replica (one group per TP rank) instead of "
               "the dp all-reduce plus the first/last-stage sum; lossless. With "
               "pipeline size 1 there is no embedding channel and this changes nothing.")
    # ---- emb channel: Optimus-CC embedding gradient compression (lossy)
    emb_grad_comp: bool = flag(
        False, "PowerSGD on the tied embedding gradient's sum between the first and last "
               "stage: P and Q all-reduced over the embedding group (one replica, after the dp "
               "all-reduce), or with --emb-comm-opt over the fused group (every replica). Lossy; "
               "Q warm-started; exact during --emb-grad-comp-warm-up.")
    emb_grad_comp_type: str = flag(
        "PowerSGD", "Reducer of --emb-grad-comp (Optimus-CC implements PowerSGD only).",
        choices=["PowerSGD"])
    emb_grad_comp_rank: int = flag(
        4, "Rank r of the embedding PowerSGD (Optimus-CC default 4). Where r (V/tp + H) >= "
           "(V/tp) H the gradient is summed exactly instead.")
    emb_grad_comp_warm_up: float = flag(
        0.1, "Fraction of --train-iters (from the start) whose embedding sync is exact; in "
             "[0, 1).")
    emb_use_error_feedback: bool = flag(
        False, "--emb-grad-comp keeps each stage's share of the residual (E = M - M_hat / "
               "members; the shares sum to the whole residual) and adds it to its next "
               "gradient.")

    # ---- tp channel: Optimus-CC's tensor-parallel compression (megatron/cc/tp_reduce.py)
    mp_acti_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the forward all-reduce of the "
               "row-parallel layers (attention and MLP output projections); lossy. Needs "
               "--tensor-model-parallel-size > 1.")
    mp_acti_comp_rank: int = flag(16, "Rank r of --mp-acti-comp's P (tokens x r) and Q "
                                     "(hidden x r).")
    mp_acti_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose forward tp sums are exact; "
             "in [0, 1).")
    mp_acti_comp_type: str = flag("PowerSGD", "Reducer of --mp-acti-comp.",
                                  choices=["PowerSGD"])
    mp_grad_comp: bool = flag(
        False, "PowerSGD (warm-started Q, no error feedback) on the backward all-reduce of the "
               "column-parallel layers' input gradients (QKV, MLP input, output layer); lossy. "
               "Needs --tensor-model-parallel-size > 1.")
    mp_grad_comp_rank: int = flag(16, "Rank r of --mp-grad-comp's factors.")
    mp_grad_comp_warm_up: float = flag(
        0.0, "Fraction of --train-iters (from the start) whose backward tp sums are exact; "
             "in [0, 1).")
    mp_grad_comp_type: str = flag("PowerSGD", "Reducer of --mp-grad-comp.",
                                  choices=["PowerSGD"])

    def validate_inter_grad_comp(self, pp: int) -> None:
        if self.inter_grad_comp_rank < 1:
            raise ConfigError(f"--inter-grad-comp-rank must be >= 1, got "
                              f"{self.inter_grad_comp_rank}")
        if self.inter_grad_comp_power_iters < 1:
            raise ConfigError(f"--inter-grad-comp-power-iters must be >= 1, got "
                              f"{self.inter_grad_comp_power_iters}")
        if not 0.0 <= self.inter_grad_comp_warm_up < 1.0:
            raise ConfigError(f"--inter-grad-comp-warm-up is a fraction of --train-iters in "
                              f"[0, 1), got {self.inter_grad_comp_warm_up}")
        if self.use_error_feedback and not (self.compressed_backprop or self.grad_comp):
            raise ConfigError("--use-error-feedback switches on error feedback of compressed "
                              "backpropagation (LEP) or of --grad-comp's PowerSGD; add "
                              "--inter-grad-comp or --grad-comp")
        for name in ("inter_grad_comp_epilogue_only",
                     "lep_flush_on_uncompressed", "check_orth_error_acti"):
            if getattr(self, name) and not self.compressed_backprop:
                raise ConfigError(f"--{name.replace('_', '-')} modifies compressed "
                                  f"backpropagation; add --inter-grad-comp")
        if self.lep_flush_on_uncompressed and not self.use_error_feedback:
            raise ConfigError("--lep-flush-on-uncompressed delivers the LEP error; add "
                              "--use-error-feedback")
        if self.check_orth_error_acti and not self.use_error_feedback:
            raise ConfigError("--check-orth-error-acti measures the LEP error; add "
                              "--use-error-feedback")

    # ---- fwd channel helpers and checks (AC-SGD / TAH-Quant)
    @property
    def compressed_backprop(self) -> bool:
        """CB on the bwd channel, asked for in either spelling."""
        return self.inter_grad_comp or self.backward_compress_method == "lowrank"

    @property
    def cb_rank(self) -> int:
        return self.backward_rank if self.backward_rank is not None else self.inter_grad_comp_rank

    @property
    def activation_cache(self) -> bool:
        """The fwd codec keeps a per-sample cache (keyed by dataset index across epochs)."""
        return self.forward_compress_method in ("delta", "delta-lowbits")

    @property
    def uses_epochs(self) -> bool:
        """Training revisits a fixed set of samples epoch after epoch (see the Trainer)."""
        return self.activation_cache or self.warmup_epochs > 0

    def validate_pipeline_codecs(self, pp: int) -> None:
        fwd, bwd = self.forward_compress_method, self.backward_compress_method
        if pp == 1 and (fwd != "none" or bwd != "none"):
            raise ConfigError(f"--forward-compress-method {fwd} / --backward-compress-method "
                              f"{bwd} compress what crosses pipeline stages; with "
                              f"--pipeline-model-parallel-size 1 nothing does")
        for name in ("forward_bits", "forward_bits_act", "backward_bits", "high_precision_bits",
                     "low_precision_bits"):
            if not 1 <= getattr(self, name) <= 8:
                raise ConfigError(f"--{name.replace('_', '-')} must be in 1..8, got "
                                  f"{getattr(self, name)}")
        t = self.tile_size
        if not 2 <= t <= 256 or t & (t - 1):
            raise ConfigError(f"--tile-size must be a power of two in 2..256, got {t}")
        if not 0.0 <= self.high_precision_allocation_ratio <= 1.0:
            raise ConfigError(f"--high-precision-allocation-ratio must be in [0, 1], got "
                              f"{self.high_precision_allocation_ratio}")
        self._validate_cache()
        self._validate_backward()
        if self.warmup_epochs < 0 or self.compress_warmup_iters < 0:
            raise ConfigError("--warmup-epochs and --compress-warmup-iters must be >= 0")
        if self.warmup_epochs and self.compress_warmup_iters:
            raise ConfigError(f"--warmup-epochs {self.warmup_epochs} and --compress-warmup-iters "
                              f"{self.compress_warmup_iters} both set the warm-up; give one")
        if self.stochastic_rounding and fwd not in ("fixpoint", "delta", "delta-lowbits") \
                and bwd != "fixpoint" and not self.dp_plugin.quantises:
            raise ConfigError("--stochastic-rounding changes the fixpoint / delta quantisers, "
                              f"but --forward-compress-method is {fwd} and "
                              f"--backward-compress-method is {bwd}")
        if self.quant_scheme != "fitted" and fwd not in ("fixpoint", "delta", "delta-lowbits") \
                and bwd != "fixpoint" and not self.dp_plugin.quantises:
            raise ConfigError(f"--quant-scheme {self.quant_scheme} changes the fixpoint / delta / "
                              f"cocktail quantisers, but none is on: --forward-compress-method "
                              f"is {fwd}, --backward-compress-method {bwd}")

    def _validate_cache(self) -> None:
        if not self.activation_cache:
            for name, default in (("max_activation_cache_size", None),
                                  ("activation_cache_location", "ram"),
                                  ("activation_cache_dtype", "fp16")):
                if getattr(self, name) != default:
                    raise ConfigError(f"--{name.replace('_', '-')} configures the delta "
                                      f"codecs' activation cache, but --forward-compress-method "
                                      f"is {self.forward_compress_method}")
        if self.forward_compress_method == "delta-lowbits" and \
                self.activation_cache_dtype != "fp16":
            raise ConfigError(f"--activation-cache-dtype {self.activation_cache_dtype} sets the "
                              f"dense cache of --forward-compress-method delta; delta-lowbits "
                              f"stores its cache at --forward-bits-act bits")
        n = self.max_activation_cache_size
        if n is not None and n < 1:
            raise ConfigError(f"--max-activation-cache-size must be >= 1, got {n}")
        loc = self.activation_cache_location
        if loc not in ("ram", "device"):
            if not loc.startswith("disk:") or not os.path.isdir(loc[5:]):
                raise ConfigError(f"--activation-cache-location must be 'ram', 'device' or "
                                  f"'disk:DIR' with an existing directory DIR, got {loc!r}")

    def _validate_backward(self) -> None:
        bwd = self.backward_compress_method
        if self.inter_grad_comp and bwd == "fixpoint":
            raise ConfigError("--inter-grad-comp (low-rank CB) and --backward-compress-method "
                              "fixpoint both claim the backward channel; pick one")
        if self.backward_tile_size is not None:
            t = self.backward_tile_size
            if bwd != "fixpoint":
                raise ConfigError(f"--backward-tile-size sets fixpoint gradient tiles, but "
                                  f"--backward-compress-method is {bwd}")
            if t < 1 or t & (t - 1):
                raise ConfigError(f"--backward-tile-size must be a power of two, got {t}")
        if self.backward_rank is not None:
            if bwd != "lowrank":
                raise ConfigError(f"--backward-rank is the rank of --backward-compress-method "
                                  f"lowrank, but the method is {bwd}")
            if self.backward_rank < 1:
                raise ConfigError(f"--backward-rank must be >= 1, got {self.backward_rank}")
            if self.inter_grad_comp and self.backward_rank != self.inter_grad_comp_rank:
                raise ConfigError(f"--backward-rank {self.backward_rank} and "
                                  f"--inter-grad-comp-rank {self.inter_grad_comp_rank} give the "
                                  f"same CB codec two ranks; drop --inter-grad-comp or make "
                                  f"them equal")

    def validate(self, pp: int, dp: int, tp: int) -> None:
        self.validate_auto()
        self.validate_pipeline_codecs(pp)
        self.validate_inter_grad_comp(pp)
        self.validate_dp_mode(pp, dp)
        self.validate_seed_options(pp)
        self.validate_tp_comp(tp)

    def validate_tp_comp(self, tp: int) -> None:
        """--mp-acti-comp / --mp-grad-comp (their options without them: validate_seed_options)."""
        for what in ("acti", "grad"):
            on = getattr(self, f"mp_{what}_comp")
            if on and tp == 1:
                raise ConfigError(f"--mp-{what}-comp compresses the tensor-parallel "
                                  f"all-reduces; with --tensor-model-parallel-size 1 there are "
                                  f"none (raise it, or drop --mp-{what}-comp)")
            if getattr(self, f"mp_{what}_comp_rank") < 1:
                raise ConfigError(f"--mp-{what}-comp-rank must be >= 1")
            if not 0.0 <= getattr(self, f"mp_{what}_comp_warm_up") < 1.0:
                raise ConfigError(f"--mp-{what}-comp-warm-up is a fraction of --train-iters in "
                                  f"[0, 1)")

    # fields --compression auto leaves to the user: logging, seeds, transports, emulation
    AUTO_KEEPS = ("compression", "quality_budget", "check_comp_ratio", "check_comp_speed",
                  "comp_seed", "dp_backend", "hetero")

    def validate_auto(self) -> None:
        """--compression auto owns every codec field: one given by hand would be overridden
        or would change what the planner predicted, so it is refused by name."""
        import dataclasses
        if self.quality_budget < 0:
            raise ConfigError(f"--quality-budget is a loss gap in percent, >= 0; got "
                              f"{self.quality_budget}")
        if self.compression == "manual":
            if self.quality_budget != type(self).quality_budget:   # the field's default
                raise ConfigError("--quality-budget is the budget of --compression auto; add "
                                  "--compression auto or drop it")
            return
        for f in dataclasses.fields(self):
            if f.name not in self.AUTO_KEEPS and getattr(self, f.name) != f.default:
                raise ConfigError(f"--{f.name.replace('_', '-')} is chosen by --compression "
                                  f"auto; drop it, or use --compression manual")

    def validate_seed_options(self, pp: int) -> None:
        """Optimus-CC's emb compression, CB codec type, seed, and the options of
        its tensor-parallel compression given without it."""
        import dataclasses
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, needs, flag_ in (("inter_grad_comp_type", self.compressed_backprop,
                                    "--inter-grad-comp"),
                                   ("emb_grad_comp_type", self.emb_grad_comp, "--emb-grad-comp"),
                                   ("emb_grad_comp_rank", self.emb_grad_comp, "--emb-grad-comp"),
                                   ("emb_grad_comp_warm_up", self.emb_grad_comp,
                                    "--emb-grad-comp"),
                                   ("emb_use_error_feedback", self.emb_grad_comp,
                                    "--emb-grad-comp"),
                                   *((f"mp_{what}_comp_{part}", getattr(self, f"mp_{what}_comp"),
                                      f"--mp-{what}-comp") for what in ("acti", "grad")
                                     for part in ("rank", "warm_up", "type"))):
            if getattr(self, name) != defaults[name] and not needs:
                raise ConfigError(f"--{name.replace('_', '-')} configures {flag_}; add "
                                  f"{flag_} (or drop --{name.replace('_', '-')})")
        if self.emb_grad_comp:
            if pp < 2:
                raise ConfigError("--emb-grad-comp compresses the tied embedding gradient "
                                  "between the first and last pipeline stage; with "
                                  "--pipeline-model-parallel-size 1 there is none: drop it")
            if self.emb_grad_comp_rank < 1:
                raise ConfigError(f"--emb-grad-comp-rank must be >= 1, got "
                                  f"{self.emb_grad_comp_rank}")
            if not 0.0 <= self.emb_grad_comp_warm_up < 1.0:
                raise ConfigError(f"--emb-grad-comp-warm-up is a fraction of --train-iters in "
                                  f"[0, 1), got {self.emb_grad_comp_warm_up}")
