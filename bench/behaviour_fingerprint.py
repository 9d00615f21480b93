"""Behaviour fingerprint: exact losses, wire bytes and checkpoint tensors of a fixed set of short
runs, to show that a refactor changed nothing.

Each run is a few iterations of pretrain_gpt.py at a tiny shape on gloo (the embedded corpus),
covering every pipeline codec, every data-parallel mode, the embedding and tensor-parallel
channels, interleaving, overlap and a resume. Recorded per run: every iteration's loss as an
exact float, the bytes each rank put on each channel (sent and uncompressed), and a SHA-256 of
every tensor (and plain value) in the saved checkpoint. Two fingerprints
taken before and after a change must be equal; `--compare` names what differs.

    python bench/behaviour_fingerprint.py --out /tmp/before.json          # all runs
    python bench/behaviour_fingerprint.py --out /tmp/x.json --only 'dp-*'
    python bench/behaviour_fingerprint.py --compare /tmp/before.json /tmp/after.json
    python bench/behaviour_fingerprint.py --out /tmp/after.json --load-from /tmp/before.json
        (also resumes each run from the checkpoint the first fingerprint saved, one more
        iteration: a checkpoint written before the change must load after it)
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TINY = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--attention-dropout", "0",
        "--hidden-dropout", "0", "--seed", "1234", "--log-interval", "1",
        "--eval-interval", "1000", "--eval-iters", "1", "--distributed-backend", "gloo"]
ITERS = 4
PP2 = ["--pipeline-model-parallel-size", "2"]
DP2 = ["--global-batch-size", "8"]   # with 2 ranks and pp 1: dp 2, 2 micro-batches each
PP2_DP2 = PP2 + ["--global-batch-size", "16"]
PP = PP2 + ["--global-batch-size", "8"]

# name -> (ranks, flags)
RUNS: Dict[str, tuple] = {
    "pp-none": (2, PP),
    "pp-fixpoint4": (2, PP + ["--forward-compress-method", "fixpoint", "--forward-bits", "4"]),
    "pp-fixpoint-bwd": (2, PP + ["--backward-compress-method", "fixpoint"]),
    "pp-delta": (2, PP + ["--forward-compress-method", "delta"]),
    "pp-delta-lowbits": (2, PP + ["--forward-compress-method", "delta-lowbits"]),
    "pp-tah": (2, PP + ["--forward-compress-method", "tah"]),
    "pp-subspace": (2, PP + ["--forward-compress-method", "subspace", "--subspace-rank", "4"]),
    "pp-cb-lep": (2, PP + ["--inter-grad-comp", "--inter-grad-comp-rank", "4",
                           "--use-error-feedback"]),
    "pp-interleaved": (2, PP + ["--virtual-pipeline-model-parallel-size", "2",
                                "--forward-compress-method", "fixpoint"]),
    "pp-overlap": (2, PP + ["--overlap-p2p-comm", "--forward-compress-method", "fixpoint"]),
    "dp-allreduce": (2, DP2),
    "dp-powersgd": (2, DP2 + ["--grad-comp", "--grad-comp-rank", "2"]),
    "dp-diloco": (2, DP2 + ["--dp-mode", "diloco", "--diloco-inner-steps", "2",
                            "--diloco-compression", "int8"]),
    "dp-sparseloco": (2, DP2 + ["--dp-mode", "sparseloco", "--diloco-inner-steps", "2"]),
    "dp-cocktail": (2, DP2 + ["--dp-mode", "cocktail_sgd"]),
    "dp-preduce": (2, DP2 + ["--dp-mode", "preduce"]),
    "dp-adpsgd": (2, DP2 + ["--dp-mode", "adpsgd"]),
    "dp-overlap-distopt": (2, DP2 + ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                     "--overlap-param-gather"]),
    "emb-fused-sc": (4, PP2_DP2 + ["--emb-comm-opt", "--grad-comp", "--grad-comp-rank", "2",
                                   "--selective-grad-comp", "--selective-grad-comp-way", "1"]),
    "emb-powersgd": (4, PP2_DP2 + ["--emb-grad-comp", "--emb-grad-comp-rank", "2"]),
    "tp2-powersgd": (2, ["--tensor-model-parallel-size", "2", "--global-batch-size", "4",
                         "--mp-acti-comp", "--mp-grad-comp", "--mp-acti-comp-rank", "4",
                         "--mp-grad-comp-rank", "4"]),
}
RESUME = "pp-cb-lep"   # also stopped at ITERS/2, saved, resumed to ITERS (equal to one go)


def entry(out: str, argv: List[str]) -> int:
    """One rank of one run: train with pretrain_gpt.py's main, keeping exact losses and the
    bytes this rank counted, written to out.<rank>.json."""
    sys.path.insert(0, ROOT)
    from megatron.cc.common.stats import ChannelStats
    from megatron.training.loop import training
    from megatron.training.pretrain import main

    totals = {"sent": {}, "raw": {}}
    add = ChannelStats.add

    def counted_add(self, channel, sent, raw, inter=None):
        totals["sent"][channel] = totals["sent"].get(channel, 0) + int(sent)
        totals["raw"][channel] = totals["raw"].get(channel, 0) + int(raw)
        return add(self, channel, sent, raw, inter)

    ChannelStats.add = counted_add
    record = {}
    train = training.Trainer.train

    def recorded_train(self):
        record["start"] = self.iteration
        train(self)
        record["losses"] = [float(x) for x in self.loss_history]

    training.Trainer.train = recorded_train
    code = main(argv)
    rank = int(os.environ.get("RANK", "0"))
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump({"record": record, "bytes": totals}, f, sort_keys=True)
    return code


def _hash_value(h, value) -> None:
    import torch
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(repr(k).encode())
            _hash_value(h, value[k])
    elif isinstance(value, (list, tuple)):
        for v in value:
            _hash_value(h, v)
    elif isinstance(value, (int, float, str, bool, type(None))):
        h.update(repr(value).encode())
    else:
        h.update(type(value).__name__.encode())   # namespaces of flags: paths differ by run


def checkpoint_digest(save: str) -> Dict[str, str]:
    """{file under save/: sha256 over its tensors and plain values, flags left out}."""
    import torch
    digests = {}
    for dirpath, _, files in os.walk(save):
        for name in sorted(files):
            if not name.endswith(".pt"):
                continue
            path = os.path.join(dirpath, name)
            obj = torch.load(path, map_location="cpu", weights_only=False)
            if isinstance(obj, dict):
                obj = {k: v for k, v in obj.items() if k not in ("args", "cc_args", "flags")}
            h = hashlib.sha256()
            _hash_value(h, obj)
            digests[os.path.relpath(path, save)] = h.hexdigest()
    return digests


def launch(name: str, ranks: int, flags: List[str], work: str, port: int) -> dict:
    out = os.path.join(work, name)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(port), os.path.abspath(__file__), "--entry", out, "--",
           *TINY, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.returncode, "tail": (proc.stdout + proc.stderr)[-3000:]}
    per_rank = {}
    for r in range(ranks):
        with open(f"{out}.{r}.json") as f:
            per_rank[str(r)] = json.load(f)
    return {"ranks": per_rank}


def run_all(names: List[str], load_from: dict = None, port: int = 29650) -> dict:
    result = {}
    work = tempfile.mkdtemp(prefix="fingerprint-")
    try:
        for i, name in enumerate(names):
            ranks, flags = RUNS[name]
            save = os.path.join(work, f"{name}-ckpt")
            common = flags + ["--train-iters", str(ITERS)]
            entry_ = launch(name, ranks, common + ["--save", save, "--save-interval",
                                                   str(ITERS)], work, port + i)
            if "ranks" in entry_:
                entry_["checkpoint"] = checkpoint_digest(save)
                entry_["checkpoint_dir"] = save
            if name == RESUME:
                half = os.path.join(work, f"{name}-half")
                first = launch(f"{name}-first", ranks, flags + [
                    "--train-iters", str(ITERS), "--exit-interval", str(ITERS // 2),
                    "--save", half, "--save-interval", str(ITERS // 2)], work, port + 100 + i)
                second = launch(f"{name}-second", ranks, flags + [
                    "--train-iters", str(ITERS), "--load", half], work, port + 200 + i)
                entry_["resumed"] = {"first": first, "second": second}
            if load_from and "checkpoint_dir" in load_from.get(name, {}):
                entry_["loads_earlier"] = launch(f"{name}-load", ranks, flags + [
                    "--train-iters", str(ITERS + 1), "--load",
                    load_from[name]["checkpoint_dir"]], work, port + 300 + i)
            result[name] = entry_
            status = "ok" if "ranks" in entry_ else f"FAILED ({entry_['error']})"
            print(f"{name:22s} {status}", flush=True)
        return result
    finally:
        if not load_from:   # keep the checkpoints: a later fingerprint loads them
            print(f"checkpoints kept under {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _strip(entry_: dict) -> dict:
    """The parts that must match (paths and the earlier checkpoint's load left out)."""
    return {k: v for k, v in entry_.items() if k not in ("checkpoint_dir", "loads_earlier")}


def compare(a: dict, b: dict) -> List[str]:
    diffs = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            diffs.append(f"{name}: only in {'first' if name in a else 'second'}")
        elif _strip(a[name]) != _strip(b[name]):
            for key in sorted(set(_strip(a[name])) | set(_strip(b[name]))):
                if a[name].get(key) != b[name].get(key):
                    diffs.append(f"{name}: {key} differs")
    for name, entry_ in sorted(b.items()):
        load = entry_.get("loads_earlier")
        if load is not None and "ranks" not in load:
            diffs.append(f"{name}: the earlier checkpoint did not load:\n{load['tail']}")
    return diffs


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--entry"]:
        return entry(argv[1], argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the fingerprint here")
    p.add_argument("--only", default="*", help="comma-separated run names or globs")
    p.add_argument("--load-from", help="an earlier fingerprint whose checkpoints must load")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = p.parse_args(argv)
    if a.compare:
        with open(a.compare[0]) as f, open(a.compare[1]) as g:
            diffs = compare(json.load(f), json.load(g))
        print("\n".join(diffs) if diffs else "identical: losses, bytes, checkpoints, resume")
        return 1 if diffs else 0
    if not a.out:
        p.error("give --out FILE (or --compare A B)")
    names = [n for n in RUNS if any(fnmatch.fnmatch(n, g) for g in a.only.split(","))]
    load_from = None
    if a.load_from:
        with open(a.load_from) as f:
            load_from = json.load(f)
    result = run_all(names, load_from)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    failed = [n for n, e in result.items() if "ranks" not in e]
    print(f"{len(result) - len(failed)} of {len(result)} runs recorded -> {a.out}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
