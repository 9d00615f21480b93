"""Zero-/few-shot evaluation with lm-evaluation-harness (lm-eval + accelerate) on an exported model.

    # offline, the tasks shipped in tools/checkpoint/eval_tasks/ (held-out text, no download):
    python tools/checkpoint/eval_lm.py --model hf/run1 \\
        --tasks heldout_continuation,heldout_perplexity --offline
    # the paper's Tables 3-4, on a machine that reaches the Hugging Face hub:
    python tools/checkpoint/eval_lm.py --model hf/run1 \\
        --tasks lambada_openai,hellaswag,piqa,mathqa,winogrande,race
    # straight from a training checkpoint (exported to a temporary directory first):
    python tools/checkpoint/eval_lm.py --load ckpts/run1 --tasks piqa
    # offline, with your own task YAMLs (and their data files) from a local directory:
    python tools/checkpoint/eval_lm.py --model hf/run1 --include-path my_tasks \\
        --tasks my_mc,my_ppl --offline

It calls lm-eval's Python API, `lm_eval.simple_evaluate(model="hf", ...)`, so any task or
task YAML lm-eval understands works, and prints the result table with lm_eval.utils.make_table
(plus the group table when tasks form groups). --output-path saves the results as JSON.
The shipped tasks (eval_tasks/) are always available; when every requested task is local,
lm-eval's own task index is not built (it takes seconds). The tasks are loaded before the
model, so an unknown task or one whose data cannot be had stops at once. Every failure is one
`eval_lm.py: error: ...` line on stderr and exit status 2 (--traceback shows lm-eval's own).
Needs `pip install lm-eval accelerate` (the project's `eval` extra).
"""
import argparse
import json
import logging
import os
import sys
import tempfile
import time
import traceback

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))

from tools.checkpoint.common import add_tokenizer_flags, fail, set_offline  # noqa: E402

PAPER_TASKS = "lambada_openai,hellaswag,piqa,mathqa,winogrande,race"
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_tasks")
SHIPPED_TASKS = ("heldout_continuation", "heldout_perplexity")
PROG = "eval_lm.py"


class EvalError(Exception):
    """A refusal with its message (one line, naming the flag or task and the fix)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one `prog: error:` line (not usage + error)."""

    def error(self, message):
        fail(f"{message} (see --help)", prog=self.prog)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="Hugging Face model directory (from export_hf.py).")
    src.add_argument("--load", help="Training checkpoint directory; exported to a temporary "
                                    "directory first (tokenizer flags below apply).")
    p.add_argument("--tasks", default=PAPER_TASKS,
                   help=f"Comma-separated lm-eval task names (default: the paper's, "
                        f"{PAPER_TASKS}, whose data comes from the Hugging Face hub). Offline: "
                        f"the shipped {', '.join(SHIPPED_TASKS)} (tools/checkpoint/eval_tasks/) "
                        f"or your own with --include-path.")
    p.add_argument("--include-path", action="append", default=None,
                   help="Directory of extra task YAMLs (repeatable); their names become "
                        "valid --tasks. The shipped eval_tasks/ directory is always included.")
    p.add_argument("--only-include-path", action="store_true",
                   help="Index only the shipped and --include-path tasks, never lm-eval's own "
                        "(its built-in task names are then unknown). Without it, lm-eval's "
                        "index is built only when a requested task is not local.")
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
                   help="Never contact the Hugging Face hub (sets HF_HUB_OFFLINE, "
                        "HF_DATASETS_OFFLINE, TRANSFORMERS_OFFLINE): task data must be local "
                        "files or already in the datasets cache.")
    p.add_argument("--traceback", action="store_true",
                   help="On a failure, show the full Python traceback instead of one line.")
    add_tokenizer_flags(p, purpose="with --load only; default: the checkpoint's")
    return p


# --------------------------------------------------------------------------- failures

def describe(e: BaseException) -> str:
    """One line for an exception: its type and first message line, or where it was raised."""
    lines = str(e).strip().splitlines()
    if lines:
        return f"{type(e).__name__}: {lines[0]}"
    frames = traceback.extract_tb(e.__traceback__)
    if frames:
        f = frames[-1]
        return (f"{type(e).__name__} at {os.path.basename(f.filename)}:{f.lineno}"
                + (f" ({f.line})" if f.line else ""))
    return type(e).__name__


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_hub_unreachable(e: BaseException) -> bool:
    """Did this fail because the Hugging Face hub could not (or must not) be reached?"""
    for x in _chain(e):
        name = type(x).__name__
        if name in ("OfflineModeIsEnabled", "ConnectionError", "ConnectTimeout",
                    "ConnectError", "LocalEntryNotFoundError") or "on the Hub" in str(x):
            return True
    return False


def hub_offline() -> bool:
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def offline_hint() -> str:
    return (f"offline, run the shipped tasks ({','.join(SHIPPED_TASKS)}, in "
            f"tools/checkpoint/eval_tasks/) or your own YAMLs with local data files "
            f"(--include-path DIR)")


class _QuietCustomDataset(logging.Filter):
    """lm-eval warns on every task that loads its data with a function (custom_dataset), as
    the shipped tasks do, about a --metadata option they do not use."""

    def filter(self, record):
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


# --------------------------------------------------------------------------- tasks

def task_manager(tasks, include_path=None, only_include_path: bool = False):
    """(TaskManager that knows every task in `tasks`, names of the local tasks)."""
    from lm_eval.tasks import TaskManager
    paths = [SHIPPED_DIR] + [os.path.abspath(d) for d in include_path or []]
    for d in paths[1:]:
        if not os.path.isdir(d):
            raise EvalError(f"--include-path {d}: no such directory")
    local = TaskManager(include_path=paths, include_defaults=False)
    local_names = set(local.all_tasks)
    manager = local
    if not only_include_path and not all(t in local_names for t in tasks):
        manager = TaskManager(include_path=paths, include_defaults=True)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = ("drop --only-include-path for lm-eval's own tasks, or add --include-path DIR"
                 if only_include_path else "give lm-eval task names or add --include-path DIR "
                 "with their YAMLs")
        raise EvalError(f"--tasks: unknown task(s) {', '.join(unknown)}; {where} (shipped "
                        f"offline tasks: {', '.join(SHIPPED_TASKS)})")
    return manager, local_names


def load_tasks(manager, tasks, local_names):
    """The Task/Group objects of `tasks`, loaded (data included) one by one, so a failure
    names its task."""
    objs = []
    for name in tasks:
        try:
            loaded = manager.load([name])
        except Exception as e:
            if is_hub_unreachable(e):
                why = ("offline mode is on (--offline, or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE "
                       "set) and it is not in the local datasets cache" if hub_offline()
                       else "the hub cannot be reached from here")
                raise EvalError(f"--tasks {name}: its data is on the Hugging Face hub and {why}; "
                                f"{offline_hint()}") from e
            raise EvalError(f"--tasks {name}: lm-eval cannot load it: {describe(e)}") from e
        if name in loaded["groups"]:
            objs.append(loaded["groups"][name])
        elif name in loaded["tasks"]:
            objs.append(loaded["tasks"][name])
        else:   # a tag: its tasks
            objs.extend(loaded["tasks"].values())
    return objs


def evaluate(model_dir: str, tasks, include_path=None, num_fewshot=None, batch_size="8",
             limit=None, device=None, dtype="float32", seed=1234,
             only_include_path: bool = False, loaded=None) -> dict:
    """lm-eval results dict for `tasks` (a list of names) on a Hugging Face model directory.
    `loaded`: (manager, task objects) from task_manager/load_tasks, else made here."""
    import torch
    from lm_eval import simple_evaluate
    if loaded is None:
        manager, local_names = task_manager(tasks, include_path, only_include_path)
        loaded = manager, load_tasks(manager, tasks, local_names)
    manager, objs = loaded
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    bs = batch_size if str(batch_size).startswith("auto") else int(batch_size)
    if limit is not None and limit >= 1:
        limit = int(limit)
    return simple_evaluate(
        model="hf", model_args={"pretrained": model_dir, "dtype": dtype},
        tasks=objs, num_fewshot=num_fewshot, batch_size=bs, device=device, limit=limit,
        task_manager=manager, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=seed, log_samples=False)


def format_tables(results: dict) -> str:
    from lm_eval.utils import make_table
    out = make_table(results)
    if results.get("groups"):
        out += "\n" + make_table(results, "groups")
    return out


def check_flags(a) -> None:
    if not str(a.batch_size).startswith("auto"):
        try:
            if int(a.batch_size) < 1:
                raise ValueError
        except ValueError:
            raise EvalError(f"--batch-size {a.batch_size}: give a positive integer or 'auto'")
    if a.limit is not None and a.limit <= 0:
        raise EvalError(f"--limit {a.limit}: give a count >= 1 or a fraction in (0, 1)")
    if a.model is not None:
        if not os.path.isdir(a.model):
            raise EvalError(f"--model {a.model}: no such directory; export a checkpoint with "
                            f"tools/checkpoint/export_hf.py, or pass --load CHECKPOINT_DIR")
        if not os.path.isfile(os.path.join(a.model, "config.json")):
            raise EvalError(f"--model {a.model}: no config.json, not a Hugging Face model "
                            f"directory; export a checkpoint with tools/checkpoint/export_hf.py "
                            f"or pass --load")
    elif not os.path.isdir(a.load):
        raise EvalError(f"--load {a.load}: no such directory")


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.offline:
        set_offline()  # before lm_eval / datasets / transformers are imported
    t0 = time.time()
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        return fail(f"lm-eval is not installed ({e}): pip install lm-eval accelerate (the "
                    f"project's eval extra: pip install -e '.[eval]')", prog=PROG)
    logging.getLogger("lm_eval.api.task").addFilter(_QuietCustomDataset())
    tmp = None
    try:
        if not tasks:
            raise EvalError("--tasks is empty; give comma-separated task names")
        check_flags(a)
        manager, local_names = task_manager(tasks, a.include_path, a.only_include_path)
        objs = load_tasks(manager, tasks, local_names)   # before the model: fail fast
        model_dir = a.model
        if a.load:
            from tools.checkpoint.export_hf import export
            tmp = tempfile.TemporaryDirectory(prefix="eval_lm_")
            model_dir = export(a.load, os.path.join(tmp.name, "hf"), a,
                               require_tokenizer=True)   # lm-eval tokenizes the tasks
        results = evaluate(model_dir, tasks, num_fewshot=a.num_fewshot,
                           batch_size=a.batch_size, limit=a.limit, device=a.device,
                           dtype=a.dtype, seed=a.seed, loaded=(manager, objs))
        print(format_tables(results))
        if a.output_path:
            from megatron.training.checkpointing.save_load import atomic_write_text
            atomic_write_text(a.output_path, json.dumps(
                {k: results[k] for k in ("results", "groups", "versions", "n-shot", "config")
                 if k in results}, indent=2, default=str))
    except Exception as e:  # lm-eval, datasets, torch raise many kinds: one line, not a traceback
        if a.traceback:
            raise
        from tools.checkpoint.errors import CheckpointError, ConversionError
        if isinstance(e, (EvalError, CheckpointError, ConversionError)):
            return fail(str(e), prog=PROG)
        hint = ("; a task's answer is longer than the model's context (n_positions)"
                if "max_length" in describe(e) else "")
        return fail(f"evaluation failed: {describe(e)}{hint} (--traceback shows where)",
                    prog=PROG)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"evaluated {', '.join(tasks)} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
