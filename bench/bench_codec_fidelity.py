"""Codec fidelity: bytes per element against error, for every codec and setting, beside the
seeds' own quantisers, the rate-distortion limit and the Lloyd-Max quantiser.

Data:
  (a) Gaussian: torch.randn(64, 4, 256), generator seed 1234 (seq x batch x hidden);
  (b) real activations and activation gradients: the hidden state a pp=2 split of the demo GPT
      sends between its stages (after layer 2 of 4) and the loss gradient with respect to it,
      captured from a model this project trained (--checkpoint, default: the base model of
      bench_activation_compression.py), exported with tools/checkpoint/export_hf.py and run
      in transformers on text of the embedded corpus (heavy-tailed, with outlier channels);
  (c) a near-low-rank gradient sequence: a rank-4 gradient whose factors rotate slowly, plus
      1e-3 noise, 8 messages (the setting of CB with LEP).
Error: relative MSE, mean (x - x_hat)^2 / mean x^2. Rate R: payload bits per element, scales
included. For (a) the Gaussian rate-distortion limit D(R) = 2^(-2R) and the Lloyd-Max
(optimal fixed-rate scalar) quantiser at b bits are drawn; "vs LM" divides by Lloyd-Max at the
code's b bits (its scales not charged), "vs seed" by the seed's quantiser at the same bytes.

Quantiser schemes (megatron/cc/numerics/quant.py, --quant-scheme): fitted (ours, default),
absmax, seed (AC-SGD's / CocktailSGD's grid).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_codec_fidelity.py          # ~1 min
    .venv/bin/python bench/bench_codec_fidelity.py --no-real                  # (a) and (c) only

Targets: no codec worse than the seed's at equal bytes on (a)-(c); every scalar
quantiser within 1.25x the Lloyd-Max MSE on Gaussian data at 2-8 bits.
Writes bench/results/codec_fidelity.{md,json,png}.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from megatron.cc.codecs import get_codec, payload_bytes  # noqa: E402
from megatron.cc.codecs.lowrank import LowRankCodec  # noqa: E402

SCHEMES = ("fitted", "absmax", "seed")
TARGET_LM = 1.25


# --------------------------------------------------------------------------- references
def lloyd_max_mse(bits: int, iters: int = 400) -> float:
    """MSE of the Lloyd-Max quantiser of N(0, 1) with 2^bits levels (exact density, no
    sampling): alternate thresholds at midpoints and levels at the interval centroids."""
    n = 1 << bits
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64),
                                        torch.tensor(1.0, dtype=torch.float64))
    # start from the high-rate optimum (point density ~ pdf^(1/3), i.e. N(0, 3) quantiles)
    levels = math.sqrt(3) * normal.icdf((torch.arange(n, dtype=torch.float64) + 0.5) / n)
    for _ in range(iters):
        t = torch.cat([torch.tensor([-math.inf], dtype=torch.float64),
                       (levels[1:] + levels[:-1]) / 2,
                       torch.tensor([math.inf], dtype=torch.float64)])
        cdf, pdf = normal.cdf(t), normal.log_prob(t).exp().nan_to_num(0.0)
        p = (cdf[1:] - cdf[:-1]).clamp_min(1e-300)
        levels = (pdf[:-1] - pdf[1:]) / p
    return float(1.0 - (p * levels.square()).sum())


def rd_limit(rate: float) -> float:
    """Gaussian distortion-rate function, relative MSE at `rate` bits per element."""
    return 2.0 ** (-2 * rate)


# --------------------------------------------------------------------------------- data
def gaussian() -> torch.Tensor:
    return torch.randn(64, 4, 256, generator=torch.Generator().manual_seed(1234))


def low_rank_sequence(t: int, n=256, m=256, rank=4, noise=1e-3, seed=1234) -> torch.Tensor:
    """Message t of a rank-4 gradient with slowly rotating factors plus noise (as the CB test)."""
    g = torch.Generator().manual_seed(seed)
    u0, u1 = torch.randn(n, rank, generator=g), torch.randn(n, rank, generator=g)
    v0, v1 = torch.randn(m, rank, generator=g), torch.randn(m, rank, generator=g)
    s = torch.tensor([8.0, 4.0, 2.0, 1.0][:rank])
    a = 0.05 * t
    u, v = math.cos(a) * u0 + math.sin(a) * u1, math.cos(a) * v0 + math.sin(a) * v1
    gn = torch.Generator().manual_seed(seed + 1 + t)
    return (u * s) @ v.t() / math.sqrt(n * m) * 16 + noise * torch.randn(n, m, generator=gn)


def capture_real(checkpoint: str, corpus: str, batches: int, seq: int = 128, micro: int = 4):
    """(activations, gradients), each (seq, micro * batches, hidden) fp32: the residual stream
    after the first half of the layers and d loss / d it, from the exported checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = tempfile.mkdtemp(prefix="fidelity_hf_")
    hf = os.path.join(out, "hf")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "checkpoint", "export_hf.py"),
                    "--load", checkpoint, "--output", hf], check=True,
                   stdout=subprocess.DEVNULL)
    model = AutoModelForCausalLM.from_pretrained(hf).float()
    tok = AutoTokenizer.from_pretrained(hf)
    texts = []
    with open(corpus) as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) >= 400:
                break
    ids = tok("\n\n".join(texts), return_tensors="pt").input_ids[0]
    need = batches * micro * seq
    ids = ids[:need].reshape(batches * micro, seq)
    half = model.config.n_layer // 2
    acts, grads = [], []
    for b in range(batches):
        x = ids[b * micro:(b + 1) * micro]
        held = {}

        def hook(_m, _inp, output):
            h = output[0] if isinstance(output, tuple) else output
            h.retain_grad()
            held["h"] = h
        handle = model.transformer.h[half - 1].register_forward_hook(hook)
        loss = model(x, labels=x).loss
        loss.backward()
        handle.remove()
        model.zero_grad(set_to_none=True)
        acts.append(held["h"].detach().transpose(0, 1))   # (seq, micro, hidden)
        grads.append(held["h"].grad.detach().transpose(0, 1))
    return torch.cat(acts, dim=1), torch.cat(grads, dim=1)


# ------------------------------------------------------------------------------- codecs
def scalar_settings(kind: str):
    """(label, bits, {scheme: codec factory}) of the scalar quantisers a message of this kind
    meets: activations (fwd channel), gradients (bwd channel), flat dp / CocktailSGD values."""
    rows = []
    for b in range(1, 9):
        rows.append((f"fixpoint channel {b}b", b, {s: (lambda s=s, b=b: get_codec(
            "fixpoint", bits=b, granularity="channel", scheme=s)) for s in SCHEMES}))
    if kind in ("grad", "gauss"):
        for b in range(2, 9):
            rows.append((f"fixpoint tile-32 {b}b", b, {s: (lambda s=s, b=b: get_codec(
                "fixpoint", bits=b, granularity="tile", group_size=32, scheme=s))
                for s in SCHEMES}))
    if kind == "gauss":
        for b in range(1, 9):
            rows.append((f"bucket-128 values {b}b", b, {s: (lambda s=s, b=b: get_codec(
                "fixpoint", bits=b, granularity="bucket", group_size=128, scheme=s))
                for s in SCHEMES}))
    return rows


def rel_mse(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.float() - y.float()).square().mean() / x.float().square().mean())


def run_codec(codec, x: torch.Tensor) -> tuple[float, float]:
    """(bits per element, relative MSE) of one stateless message."""
    payload = codec.encode(x)
    y = codec.decode(payload, x.shape, torch.float32)
    return payload_bytes(payload) * 8 / x.numel(), rel_mse(x, y)


def scalar_rows(name: str, x: torch.Tensor, kind: str, lm: dict) -> list:
    rows = []
    for label, bits, factories in scalar_settings(kind):
        res = {s: run_codec(f(), x) for s, f in factories.items()}
        rate, mse = res["fitted"]
        assert all(r[0] == rate for r in res.values()), "schemes must cost the same bytes"
        rows.append(dict(data=name, codec=label, bits=bits, rate=rate, mse=mse,
                         mse_absmax=res["absmax"][1], mse_seed=res["seed"][1],
                         vs_seed=mse / res["seed"][1],
                         vs_lm=mse / lm[bits] if kind == "gauss" else None,
                         rd=rd_limit(rate) if kind == "gauss" else None))
    return rows


def other_rows(name: str, x: torch.Tensor, kind: str) -> list:
    """TAH-Quant and CB (lowrank) on the same message: no seed quantiser to put beside them
    here (TAH: the seed's algorithm is ours; CB: the seed's orthogonalised Q is ours now)."""
    rows = []
    if kind in ("act", "gauss"):
        for hi, lo in ((4, 3), (3, 2), (8, 4)):
            c = get_codec("tah", tile_size=64, high_bits=hi, low_bits=lo, high_ratio=0.8)
            rate, mse = run_codec(c, x)
            rows.append(dict(data=name, codec=f"tah {hi}/{lo}/0.8 tile 64", bits=None,
                             rate=rate, mse=mse, vs_seed=None, vs_lm=None,
                             rd=rd_limit(rate) if kind == "gauss" else None))
    if kind in ("grad", "gauss"):
        for r in (4, 16, 64):
            rate, mse = run_codec(LowRankCodec(rank=r), x)
            rows.append(dict(data=name, codec=f"lowrank r{r} (one message)", bits=None,
                             rate=rate, mse=mse, vs_seed=None, vs_lm=None,
                             rd=rd_limit(rate) if kind == "gauss" else None))
    return rows


def cache_layout_lines(acts: torch.Tensor) -> list:
    """delta-lowbits' cache quantiser: one scale per (sample, token) row (ours) against one
    per (sample, channel) (AC-SGD), same bytes when seq == hidden; relative MSE."""
    from megatron.cc.numerics.quant import dequantize, quantize
    x = acts.transpose(0, 1).contiguous()          # (B, S, H): one cached sample per row
    b_, s_, h_ = x.shape
    out = []
    for bits in (4, 8):
        for scheme in ("seed", "fitted"):
            c, sc = quantize(x, bits, "tile", h_, scheme=scheme)
            tok = rel_mse(x, dequantize(c, sc, bits, x.shape, "tile", h_, scheme=scheme))
            per_ch = []
            for i in range(b_):
                c, sc = quantize(x[i], bits, "channel", scheme=scheme)
                per_ch.append(dequantize(c, sc, bits, x[i].shape, "channel", scheme=scheme))
            ch = rel_mse(x, torch.stack(per_ch))
            out.append(f"- delta-lowbits cache, {bits} bits, {scheme} grid: rel. MSE per "
                       f"(sample, token) {tok:.3g} vs per (sample, channel) {ch:.3g} "
                       f"(scales {s_} vs {h_} per sample)")
    return out


def lowrank_sequence_rows() -> list:
    """(c): CB with LEP, rank 16, per message: relative error of M + E against the rank-16 SVD
    floor of M + E (the seed orthogonalises Q, and so do we: both reach the floor)."""
    rows = []
    for iters in (1, 2):
        c = LowRankCodec(rank=16, error_feedback=True, power_iters=iters)
        errs, floors = [], []
        for t in range(8):
            x = low_rank_sequence(t)
            e = c.error(x.shape)
            m = x + (e if e is not None else 0)
            p = c.encode(x)
            errs.append(float(torch.linalg.norm(m - c.decode(p, x.shape, torch.float32))
                              / torch.linalg.norm(m)))
            s = torch.linalg.svdvals(m)
            floors.append(float(s[16:].square().sum().sqrt() / s.square().sum().sqrt()))
        rows.append(dict(power_iters=iters, rate=payload_bytes(p) * 8 / x.numel(),
                         errors=errs, floors=floors,
                         worst_vs_floor=max(e / f for e, f in zip(errs, floors))))
    return rows


# ------------------------------------------------------------------------------ output
def table(rows: list) -> list:
    lines = ["| data | codec | bits/elem | rel. MSE (fitted) | absmax | seed | vs seed | vs LM | "
             "RD limit |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = (lambda v, fmt: "-" if v is None else format(v, fmt))
        lines.append(f"| {r['data']} | {r['codec']} | {r['rate']:.3f} | {r['mse']:.3g} | "
                     f"{f(r.get('mse_absmax'), '.3g')} | {f(r.get('mse_seed'), '.3g')} | "
                     f"{f(r['vs_seed'], '.2f')} | {f(r['vs_lm'], '.2f')} | "
                     f"{f(r['rd'], '.3g')} |")
    return lines


def verdicts(rows: list, seq: list) -> list:
    worse = [r for r in rows if r["vs_seed"] is not None and r["vs_seed"] > 1 + 1e-3]
    lm = [r for r in rows if r["vs_lm"] is not None and 2 <= r["bits"] <= 8]
    lm_bad = [r for r in lm if r["vs_lm"] > TARGET_LM]
    out = [f"- worse than the seed at equal bytes: {len(worse)} of "
           f"{sum(r['vs_seed'] is not None for r in rows)} settings"
           + "".join(f"; {r['data']} {r['codec']} x{r['vs_seed']:.3f}" for r in worse),
           f"- Gaussian, 2-8 bits, fitted vs Lloyd-Max: worst x{max(r['vs_lm'] for r in lm):.2f}"
           f" ({'target met' if not lm_bad else 'target missed'}: <= x{TARGET_LM})"]
    for s in seq:
        out.append(f"- (c) CB rank 16 + LEP, power_iters {s['power_iters']}: relative error "
                   + ", ".join(f"{e:.4f}" for e in s["errors"])
                   + f"; worst x{s['worst_vs_floor']:.2f} the SVD floor")
    return out


def plot(rows: list, lm: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        sub = [r for r in rows if r["data"] == name]
        fams = dict.fromkeys(r["codec"].rsplit(" ", 1)[0] if r["bits"] else r["codec"]
                             for r in sub)
        for fam in fams:
            pts = [r for r in sub if (r["codec"].rsplit(" ", 1)[0] if r["bits"] else
                                      r["codec"]) == fam]
            line, = ax.plot([p["rate"] for p in pts], [p["mse"] for p in pts], "o-", ms=3,
                            label=fam + (" (fitted)" if pts[0]["bits"] else ""))
            if pts[0].get("mse_seed") is not None:
                ax.plot([p["rate"] for p in pts], [p["mse_seed"] for p in pts], "x:",
                        color=line.get_color(), ms=4, label=fam + " (seed)")
        if name.startswith("(a)"):
            rates = torch.linspace(0.5, 9, 60).tolist()
            ax.plot(rates, [rd_limit(r) for r in rates], "k-", lw=1, label="RD limit 2^-2R")
            ax.plot(list(lm), list(lm.values()), "ks--", ms=3, lw=1, label="Lloyd-Max (b bits)")
        ax.set_yscale("log")
        ax.set_xlabel("bits per element (scales included)")
        ax.set_ylabel("relative MSE")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def default_checkpoint() -> str:
    return os.path.join(ROOT, "runs", "bench_acsgd", "base")


def default_corpus() -> str:
    base = os.path.join(ROOT, ".cache", "default_corpus")
    for d in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, d, "corpus.jsonl")
        if os.path.exists(path) and ".tmp" not in d:
            return path
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=default_checkpoint(),
                   help="checkpoint whose activations are captured for (b) "
                        "(default: bench_activation_compression.py's base model)")
    p.add_argument("--corpus", default=None,
                   help="jsonl with a 'text' field for (b) (default: the embedded corpus)")
    p.add_argument("--batches", type=int, default=4, help="micro-batches of 4 x 128 for (b)")
    p.add_argument("--no-real", action="store_true", help="skip (b)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    lm = {b: lloyd_max_mse(b) for b in range(1, 9)}
    rows = scalar_rows("(a) Gaussian", gaussian(), "gauss", lm)
    rows += other_rows("(a) Gaussian", gaussian(), "gauss")
    if not a.no_real:
        corpus = a.corpus or default_corpus()
        ckpt_ok = os.path.exists(os.path.join(a.checkpoint, "latest_checkpointed_iteration.txt"))
        if not ckpt_ok or not corpus:
            p.error(f"--checkpoint {a.checkpoint} or --corpus missing: run "
                    f"bench/bench_activation_compression.py first (it trains the base model), "
                    f"give --checkpoint/--corpus, or pass --no-real")
        acts, grads = capture_real(a.checkpoint, corpus, a.batches)
        extra = cache_layout_lines(acts)
        rows += scalar_rows("(b) activations", acts, "act", lm)
        rows += other_rows("(b) activations", acts, "act")
        rows += scalar_rows("(b) activation gradients", grads, "grad", lm)
        rows += other_rows("(b) activation gradients", grads, "grad")
    else:
        extra = []
    seq = lowrank_sequence_rows()
    lines = table(rows) + [""] + verdicts(rows, seq) + extra
    print("\n".join(lines))
    print("Lloyd-Max relative MSE (N(0,1)): " +
          ", ".join(f"{b}b {v:.4g}" for b, v in lm.items()))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "codec_fidelity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "codec_fidelity.json"), "w") as f:
        json.dump({"rows": rows, "lowrank_sequence": seq, "lloyd_max": lm}, f, indent=1)
    plot(rows, lm, os.path.join(a.out, "codec_fidelity.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
