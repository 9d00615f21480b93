"""Step time of iterations that save a checkpoint vs those that do not, with and without --async-save.

One process (gloo, world size 1) trains the same model twice from the same seed, saving every
--save-interval iterations: once with synchronous saves, once with --async-save. The time of an
iteration is measured from the start of its train_step to the start of the next one, so a
saving iteration includes its save (sync: the whole write; async: the host snapshot).
Iterations that run while a background write is in flight are reported separately: on a
machine with few cores the writer thread competes with training for CPU.

    .venv/bin/python bench/bench_async_save.py                     # ~600 MB checkpoints, CPU
    .venv/bin/python bench/bench_async_save.py --hidden-size 1024  # bigger
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden-size", type=int, default=512, help="Model width (default 512).")
    p.add_argument("--num-layers", type=int, default=8, help="Layers (default 8).")
    p.add_argument("--train-iters", type=int, default=16, help="Iterations per run.")
    p.add_argument("--save-interval", type=int, default=4, help="Save every N iterations.")
    p.add_argument("--dir", default=None, help="Where checkpoints go (default: a temp dir).")
    return p


def run(flags, root, async_save: bool) -> dict:
    import shutil
    from megatron.training.flags.arguments import parse_args
    from megatron.training.loop.training import Trainer
    from megatron.training.pretrain import resolve_default_data
    save = os.path.join(root, "async" if async_save else "sync")
    shutil.rmtree(save, ignore_errors=True)
    argv = flags + ["--save", save] + (["--async-save"] if async_save else [])
    args = parse_args(argv, world_size=1)
    resolve_default_data(args)
    trainer = Trainer(args)
    starts, saving, in_flight = [], set(), set()
    step, ckpt_save = trainer.train_step, trainer.ckpt.save

    def timed_step():
        starts.append(time.perf_counter())
        if trainer.ckpt.pending is not None:
            in_flight.add(len(starts) - 1)
        return step()

    def timed_save(root_dir):
        saving.add(len(starts) - 1)
        return ckpt_save(root_dir)

    trainer.train_step, trainer.ckpt.save = timed_step, timed_save
    trainer.train()
    starts.append(time.perf_counter())
    times = [b - a for a, b in zip(starts, starts[1:])]
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(save) for f in fs)
    trainer.close()
    plain = [t for i, t in enumerate(times[1:], 1) if i not in saving and i not in in_flight]
    return {"save": [times[i] for i in sorted(saving) if i < len(times) - 1],
            "overlap": [times[i] for i in sorted(in_flight) if i not in saving],
            "plain": plain, "bytes": size}


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29555"),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    from megatron.training.flags.arguments import parse_args
    from megatron.training.runtime.initialize import initialize_distributed
    flags = ["--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size),
             "--num-attention-heads", "8", "--seq-length", "128", "--micro-batch-size", "4",
             "--global-batch-size", "4", "--train-iters", str(a.train_iters),
             "--save-interval", str(a.save_interval), "--lr", "1e-4", "--log-interval",
             str(10**6), "--eval-iters", "0", "--eval-interval", str(10**6)]
    initialize_distributed(parse_args(flags + ["--save", "unused"], world_size=1))
    root = a.dir or tempfile.mkdtemp(prefix="bench_async_save_")
    rows = {mode: run(flags, root, mode == "async") for mode in ("sync", "async")}
    ms = lambda xs: f"{1000 * statistics.median(xs):8.0f}" if xs else "       -"  # noqa: E731
    print(f"checkpoint size: {rows['sync']['bytes'] / 2**20:.0f} MiB; median step time (ms), "
          f"iterations 2..{a.train_iters} (the first is warm-up)")
    print("mode   | no save  | saving   | ratio | while a write is in flight | ratio")
    for mode, r in rows.items():
        base = statistics.median(r["plain"])
        sv = statistics.median(r["save"]) / base
        ov = f"{statistics.median(r['overlap']) / base:5.2f}" if r["overlap"] else "    -"
        print(f"{mode:6s} | {ms(r['plain'])} | {ms(r['save'])} | {sv:5.2f} | "
              f"{ms(r['overlap'])}                   | {ov}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
