"""Zero-/few-shot evaluation with lm-evaluation-harness (lm-eval + accelerate) on an exported model.

    # the paper's Tables 3-4, on a machine that reaches the Hugging Face hub:
    python tools/checkpoint/eval_lm.py --model hf/run1 \\
        --tasks lambada_openai,hellaswag,piqa,mathqa,winogrande,race
    # straight from a training checkpoint (exported to a temporary directory first):
    python tools/checkpoint/eval_lm.py --load ckpts/run1 --tasks piqa
    # offline, with task YAMLs (and their data files) from a local directory:
    python tools/checkpoint/eval_lm.py --model hf/run1 --include-path my_tasks \\
        --tasks my_mc,my_ppl --offline

It calls lm-eval's Python API, `lm_eval.simple_evaluate(model="hf", ...)`, so any task or
task YAML lm-eval understands works, and prints the result table with lm_eval.utils.make_table
(plus the group table when tasks form groups). --output-path saves the results as JSON.
Needs `pip install lm-eval accelerate` (the project's `eval` extra).
"""
import argparse
import json
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

from tools.checkpoint.common import add_tokenizer_flags, fail, set_offline  # noqa: E402

PAPER_TASKS = "lambada_openai,hellaswag,piqa,mathqa,winogrande,race"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="Hugging Face model directory (from export_hf.py).")
    src.add_argument("--load", help="Training checkpoint directory; exported to a temporary "
                                    "directory first (tokenizer flags below apply).")
    p.add_argument("--tasks", default=PAPER_TASKS,
                   help=f"Comma-separated lm-eval task names (default: the paper's, "
                        f"{PAPER_TASKS}).")
    p.add_argument("--include-path", action="append", default=None,
                   help="Directory of extra task YAMLs (repeatable); their names become "
                        "valid --tasks.")
    p.add_argument("--only-include-path", action="store_true",
                   help="Index only the --include-path tasks, not lm-eval's own (starts "
                        "faster; its built-in task names are then unknown).")
    p.add_argument("--num-fewshot", type=int, default=None,
                   help="Few-shot examples per prompt (default: each task's own, usually 0).")
    p.add_argument("--batch-size", default="8", help="Batch size, or 'auto'.")
    p.add_argument("--limit", type=float, default=None,
                   help="Evaluate only this many documents per task (or a fraction < 1).")
    p.add_argument("--device", default=None, help="Device (default: cuda if present, else cpu).")
    p.add_argument("--dtype", default="float32", help="Dtype to run the model in.")
    p.add_argument("--seed", type=int, default=1234, help="Seed for lm-eval's sampling.")
    p.add_argument("--output-path", default=None, help="Write the results as JSON here.")
    p.add_argument("--offline", action="store_true",
                   help="Never contact the Hugging Face hub (datasets must be local files).")
    add_tokenizer_flags(p, purpose="with --load only; default: the checkpoint's")
    return p


def evaluate(model_dir: str, tasks, include_path=None, num_fewshot=None, batch_size="8",
             limit=None, device=None, dtype="float32", seed=1234,
             only_include_path: bool = False) -> dict:
    """lm-eval results dict for `tasks` (a list of names) on a Hugging Face model directory."""
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if only_include_path and not include_path:
        raise ValueError("--only-include-path needs --include-path DIR")
    manager = TaskManager(include_path=include_path, include_defaults=not only_include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"--tasks: unknown task(s) {', '.join(unknown)}; give lm-eval task "
                         f"names or add --include-path DIR with their YAMLs")
    bs = batch_size if str(batch_size).startswith("auto") else int(batch_size)
    if limit is not None and limit >= 1:
        limit = int(limit)
    return simple_evaluate(
        model="hf", model_args={"pretrained": model_dir, "dtype": dtype},
        tasks=list(tasks), num_fewshot=num_fewshot, batch_size=bs, device=device, limit=limit,
        task_manager=manager, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed, log_samples=False)


def format_tables(results: dict) -> str:
    from lm_eval.utils import make_table
    out = make_table(results)
    if results.get("groups"):
        out += "\n" + make_table(results, "groups")
    return out


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.offline:
        set_offline()  # before lm_eval / datasets / transformers are imported
    t0 = time.time()
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return fail("lm-eval is not installed: pip install lm-eval accelerate")
    tmp = None
    try:
        model_dir = a.model
        if a.load:
            from tools.checkpoint.export_hf import export
            tmp = tempfile.TemporaryDirectory(prefix="eval_lm_")
            model_dir = export(a.load, os.path.join(tmp.name, "hf"), a,
                               require_tokenizer=True)   # lm-eval tokenizes the tasks
        elif not os.path.isfile(os.path.join(model_dir, "config.json")):
            return fail(f"--model {model_dir}: no config.json; export a checkpoint with "
                        f"tools/checkpoint/export_hf.py or pass --load")
        results = evaluate(model_dir, tasks, a.include_path, a.num_fewshot, a.batch_size,
                           a.limit, a.device, a.dtype, a.seed, a.only_include_path)
    except Exception as e:  # lm-eval raises many kinds; report one line, not a traceback
        from tools.checkpoint.errors import CheckpointError, ConversionError
        if isinstance(e, (CheckpointError, ConversionError, ValueError)):
            return fail(str(e))
        raise
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(format_tables(results))
    if a.output_path:
        from megatron.training.checkpointing import atomic_write_text
        atomic_write_text(a.output_path, json.dumps(
            {k: results[k] for k in ("results", "groups", "versions", "n-shot", "config")
             if k in results}, indent=2, default=str))
    print(f"evaluated {', '.join(tasks)} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
