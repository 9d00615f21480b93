"""Subspace Networks <-> Hugging Face: import a pretrained model into subspace form, export back.

    # import: choose U from the weights, write a checkpoint, print the error it introduces
    python tools/checkpoint/subspace_hf.py --hf-model hf/gpt2 --save ckpts/gpt2_sub \\
        --subspace-rank 64 --pipeline-model-parallel-size 2 --coefficients
    # prints the relative logit error and both losses on a probe batch, then the flags:
    #   --load ckpts/gpt2_sub --finetune ... --hidden-dropout 0.0 \\
    #   --forward-compress-method subspace --subspace-constrain writes --subspace-rank 64

    # export: tools/checkpoint/export_hf.py as for any checkpoint; a subspace checkpoint is
    # written as the equivalent unconstrained model (W <- U U^T W, b <- U U^T b)
    python tools/checkpoint/export_hf.py --load ckpts/run1 --output hf/run1

Import. The constrained model uses U U^T W for every attention / MLP output projection
(megatron/training/model/subspace.py). For a pretrained model U is chosen from its weights: the top-k
left singular vectors of all output projections side by side, [W_proj^1 b_proj^1 W_fc2^1
b_fc2^1 ... W_fc2^L b_fc2^L] (H x sum of their input widths + 2L): the k-dim subspace that keeps
the most of their squared Frobenius norm together (Eckart-Young for the stacked matrix). The
paper's rank-collapse observation (the projection matrices of trained transformers have a low
effective rank) is what would make this cheap; how cheap is measured, not assumed: the tool
reports the kept share of that norm, and the relative max logit error and the next-token loss
on a probe batch sampled from the model itself, before and after the projection (docs/subspace.md has
the validation loss of a model trained here, imported at several k). The checkpoint holds the
projected weights (so exporting it right away gives the projected model) and U.

--coefficients: the checkpoint's args name --forward-compress-method subspace, and every stage
past the first gets its copy of the embedding (x0_embedding.*), as the training run with that
flag expects. Without it, --subspace-rank alone: whole activations between stages.
"""
import argparse
import dataclasses
import os
import sys
import time
from typing import Dict, Optional

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

import torch  # noqa: E402

from megatron.cc.pipeline.subspace import default_write_scale, saved_constrain_mode  # noqa: E402
from tools.checkpoint.common import add_tokenizer_flags, fail  # noqa: E402
from tools.checkpoint.errors import ConversionError  # noqa: E402
from tools.checkpoint.layout import (  # noqa: E402
    SUBSPACE_BASIS, SUBSPACE_SCALE, X0_COPY, CheckpointError, FullCheckpoint, split,
    write_checkpoint)

_WRITES = ("self_attention.linear_proj", "mlp.linear_fc2")


def _writes(params: Dict[str, torch.Tensor], num_layers: int):
    """(name, tensor) of every output projection weight and bias, layer by layer."""
    for i in range(num_layers):
        for mod in _WRITES:
            for what in ("weight", "bias"):
                name = f"decoder.layers.{i}.{mod}.{what}"
                if name in params:
                    yield name, params[name]


def choose_basis(params: Dict[str, torch.Tensor], num_layers: int, k: int):
    """(U (H, k) fp32, share of the stacked projections' squared norm U keeps)."""
    cols = [t.double() if t.dim() == 2 else t.double()[:, None]
            for _, t in _writes(params, num_layers)]
    if not cols:
        raise ConversionError("no output projections (linear_proj / linear_fc2) found")
    stacked = torch.cat(cols, dim=1)   # (H, sum of input widths + biases)
    if not 1 <= k <= stacked.shape[0]:
        raise ConversionError(f"--subspace-rank {k} must be in 1..hidden size "
                              f"({stacked.shape[0]})")
    u, s, _ = torch.linalg.svd(stacked, full_matrices=False)
    kept = float((s[:k] ** 2).sum() / (s ** 2).sum())
    return u[:, :k].float().contiguous(), kept


def project(params: Dict[str, torch.Tensor], u: torch.Tensor, num_layers: int,
            scale: float = 1.0) -> dict:
    """A copy of `params` with every output projection replaced by scale U U^T W (bias
    scale U U^T b)."""
    out = dict(params)
    u64 = u.double()
    for name, t in _writes(params, num_layers):
        out[name] = (u64 @ (u64.t() @ t.double()) * scale).to(t.dtype)
    return out


def unconstrain(full: FullCheckpoint) -> FullCheckpoint:
    """The equivalent ordinary model of a subspace checkpoint (the same one otherwise): the
    projections multiplied out (a U U^T W; a = 1 in checkpoints older than the write scale),
    U, a and the stages' embedding copies dropped."""
    if SUBSPACE_BASIS not in full.params:
        return full
    constrain = saved_constrain_mode(full.args.get("compression"))
    if constrain != "writes":
        raise SystemExit(f"this checkpoint was trained with --subspace-constrain {constrain}: "
                         "its stage boundaries carry k directions of the residual stream, "
                         "which a Hugging Face GPT model has no layer for; export needs a "
                         "checkpoint trained with --subspace-constrain writes")
    n = full.model_args["num_layers"]
    scale = float(full.params.get(SUBSPACE_SCALE, torch.ones(())).double())
    params = project(full.params, full.params[SUBSPACE_BASIS].float(), n, scale)
    params = {g: t for g, t in params.items()
              if g not in (SUBSPACE_BASIS, SUBSPACE_SCALE) and not g.startswith(X0_COPY)}
    return dataclasses.replace(full, params=params)


def to_subspace(full: FullCheckpoint, k: int, coefficients: bool = False,
                scale: Optional[float] = None):
    """(the FullCheckpoint in subspace form, share of the projections' norm kept). The model
    computes a U U^T W with a = `scale` (default sqrt(k / H), as a fresh one), so W is stored
    as U U^T W_hf / a: the same function."""
    n = full.model_args["num_layers"]
    u, kept = choose_basis(full.params, n, k)
    scale = default_write_scale(k, u.shape[0]) if scale is None else scale
    if not scale > 0:
        raise ConversionError(f"--subspace-write-scale {scale}: must be > 0")
    params = project(full.params, u, n, 1.0 / scale)
    params[SUBSPACE_BASIS] = u
    params[SUBSPACE_SCALE] = torch.tensor(float(scale))
    args = {**full.args, "model": {**full.args["model"], "hidden_dropout": 0.0},
            "compression": {**(full.args.get("compression") or {}), "subspace_rank": k,
                            "subspace_write_scale": scale, "subspace_constrain": "writes"}}
    if coefficients:
        args["compression"]["forward_compress_method"] = "subspace"
    return dataclasses.replace(full, params=params, args=args), kept


def probe_error(hf_model, full_sub: FullCheckpoint, tokens: torch.Tensor) -> dict:
    """Logits and loss of the original HF model and of the subspace model (exported) on
    `tokens` (B, S): relative max logit error, both next-token losses."""
    from tools.checkpoint.export_hf import VocabOnly, build_hf_model
    vocab = hf_model.config.vocab_size
    sub = build_hf_model(unconstrain(full_sub), VocabOnly(vocab, full_sub.eod))
    with torch.no_grad():
        a = hf_model.float().eval()(input_ids=tokens).logits
        b = sub(input_ids=tokens).logits

    def loss(logits):
        return float(torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)))
    return {"logit_rel_error": float((a - b).abs().max() / a.abs().max()),
            "loss_hf": loss(a), "loss_subspace": loss(b)}


def probe_tokens(hf_model, batch: int = 4, seq: int = 64, seed: int = 0) -> torch.Tensor:
    """A probe batch: greedy-free samples of the model itself (its own text, not noise:
    the error that matters is on inputs the model expects), from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    n = min(seq, hf_model.config.max_position_embeddings
            if hasattr(hf_model.config, "max_position_embeddings") else seq)
    tokens = torch.randint(0, hf_model.config.vocab_size, (batch, 1), generator=g)
    with torch.no_grad():
        for _ in range(n - 1):
            logits = hf_model.float().eval()(input_ids=tokens).logits[:, -1]
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
            tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-model", required=True, help="Local Hugging Face model directory.")
    p.add_argument("--save", required=True, help="Checkpoint directory to write.")
    p.add_argument("--subspace-rank", type=int, required=True,
                   help="k: dimension of the shared subspace of the output projections.")
    p.add_argument("--subspace-write-scale", type=float, default=None,
                   help="a of the constrained writes a U U^T W (default sqrt(k / hidden "
                        "size), as a fresh model's; the weights are stored divided by it, so "
                        "the imported function does not depend on it).")
    p.add_argument("--coefficients", action="store_true",
                   help="Write it for --forward-compress-method subspace (embedding copies on "
                        "every stage past the first); default: --subspace-rank alone.")
    p.add_argument("--tensor-model-parallel-size", dest="tp", type=int, default=1,
                   help="Tensor-parallel size of the new checkpoint (default 1).")
    p.add_argument("--pipeline-model-parallel-size", dest="pp", type=int, default=1,
                   help="Pipeline-parallel size of the new checkpoint (default 1).")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="Vocabulary padding multiple (times tp), as the training run's.")
    p.add_argument("--seq-length", type=int, default=None,
                   help="--seq-length recorded in the checkpoint's args (default: the model's "
                        "maximum positions).")
    p.add_argument("--probe-length", type=int, default=32,
                   help="Tokens per sequence of the error probe (4 sequences sampled from the "
                        "model itself); 0 skips the probe.")
    add_tokenizer_flags(p, purpose="recorded in the checkpoint (default: the HF directory's)")
    return p


def import_subspace(hf_dir: str, save: str, k: int, tp: int = 1, pp: int = 1,
                    coefficients: bool = False, probe_length: int = 32,
                    tokenizer_flags=None, seq_length: Optional[int] = None,
                    divisible_by: int = 128, scale: Optional[float] = None):
    """Write the subspace checkpoint; returns (FullCheckpoint, report dict)."""
    from transformers import AutoModelForCausalLM
    from tools.checkpoint.import_hf import full_from_hf
    full = full_from_hf(hf_dir, tp, pp, divisible_by, seq_length, tokenizer_flags)
    sub, kept = to_subspace(full, k, coefficients, scale)
    report = {"kept_norm_share": kept}
    if probe_length:
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True)
        report.update(probe_error(hf, sub, probe_tokens(hf, seq=probe_length)))
    os.makedirs(save, exist_ok=True)
    write_checkpoint(save, split(sub, tp, pp))
    return sub, report


def main(argv=None) -> int:
    from tools.checkpoint.import_hf import model_flags
    a = build_parser().parse_args(argv)
    t0 = time.time()
    try:
        sub, r = import_subspace(a.hf_model, a.save, a.subspace_rank, a.tp, a.pp,
                                 a.coefficients, a.probe_length, a, a.seq_length,
                                 a.make_vocab_size_divisible_by, a.subspace_write_scale)
    except (CheckpointError, ConversionError, ValueError) as e:
        return fail(str(e))
    print(f"subspace rank {a.subspace_rank}: keeps {100 * r['kept_norm_share']:.2f}% of the "
          f"output projections' squared norm")
    if "logit_rel_error" in r:
        print(f"probe: relative max logit error {r['logit_rel_error']:.3e}, loss "
              f"{r['loss_hf']:.4f} (HF) -> {r['loss_subspace']:.4f} (subspace)")
    # the imported model confines its writes (the method's own default projects the boundary)
    method = " --forward-compress-method subspace --subspace-constrain writes" \
        if a.coefficients else ""
    print(f"wrote {a.save} (tp={a.tp} pp={a.pp}) in {time.time() - t0:.1f}s\n"
          f"train from it with: --load {a.save} --finetune {model_flags(sub.args)}"
          f"{method} --subspace-rank {a.subspace_rank} --subspace-write-scale "
          f"{float(sub.params[SUBSPACE_SCALE]):.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
