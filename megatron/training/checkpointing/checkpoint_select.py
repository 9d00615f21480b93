"""Which checkpoint `--load DIR` resumes from: `latest` if it verifies, else refuse or fall back.

    iteration = choose_checkpoint(root, files_for, fallback)   # collective; None: DIR is empty

Every rank verifies the files it will read (checksums, checkpoint_io.verify_file) and the
verdicts are gathered, so all ranks take the same decision. A bad `latest` is refused with
the failing file named; `--ckpt-fallback` tries the newer-first committed iterations below
it instead, printing why each one is skipped (never silently).
"""
import os
import re
from typing import Callable, List, Optional

import torch.distributed as dist

from megatron.training.checkpointing.checkpoint_io import CheckpointLoadError, verify_file

LATEST = "latest_checkpointed_iteration.txt"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")   # committed only: an unfinished save ends in .tmp


def iter_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def read_latest(root: str) -> int:
    path = os.path.join(root, LATEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--load {root}: no {LATEST}; is this a checkpoint directory?")
    text = open(path).read().strip()
    if not text.isdigit():
        raise ValueError(f"--load {root}: {LATEST} holds '{text}', not an iteration number")
    return int(text)


def committed_iterations(root: str) -> List[int]:
    """Iterations with a committed iter_XXXXXXX directory, newest first."""
    if not os.path.isdir(root):
        return []
    found = (_ITER_DIR.match(d) for d in os.listdir(root))
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def candidates(root: str) -> tuple:
    """(iterations to try in order, why `latest` itself is unusable or None); ([], None): empty."""
    committed = committed_iterations(root)
    try:
        latest = read_latest(root)
    except FileNotFoundError:
        if not committed:
            return [], None
        return committed, (f"--load {root}: {LATEST} is missing although "
                           f"{os.path.basename(iter_dir(root, committed[0]))} exists")
    except ValueError as e:
        return committed, str(e)
    return [latest] + [i for i in committed if i < latest], None


def choose_checkpoint(root: str, files_for: Callable[[int], List[str]], fallback: bool,
                      log: Callable[[str], None] = print) -> Optional[int]:
    """The iteration to load (collective over the default group), or None when root is empty.

    `files_for(iteration)`: the files this rank will read (each verified against its
    checksum); `log`: where the fallback warnings go (rank 0 prints them).
    """
    plan = [candidates(root) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(plan, src=0)   # one view of the directory for every rank
    order, problem = plan[0]
    if not order and problem is None:
        return None
    if problem is not None:   # `latest` itself is missing or unreadable
        _refuse_or_warn(problem, fallback, order[0] if order else None, log)
    for i, iteration in enumerate(order):
        problem = _gathered_problem([verify_file(f) for f in files_for(iteration)])
        if problem is None:
            return iteration
        _refuse_or_warn(f"checkpoint iteration {iteration}: {problem}", fallback,
                        order[i + 1] if i + 1 < len(order) else None, log)
    raise CheckpointLoadError(f"--load {root}: no checkpoint there verifies")


def _refuse_or_warn(problem: str, fallback: bool, next_iteration: Optional[int], log) -> None:
    if not fallback:
        raise CheckpointLoadError(f"{problem}; pass --ckpt-fallback to resume from the newest "
                                  f"earlier checkpoint that verifies")
    if next_iteration is None:
        raise CheckpointLoadError(f"{problem}; --ckpt-fallback: no earlier checkpoint is left")
    log(f"warning: --ckpt-fallback: {problem}; trying iteration {next_iteration} instead")


def _gathered_problem(local: List[Optional[str]]) -> Optional[str]:
    """The first problem any rank found, the same string on every rank."""
    mine = next((p for p in local if p is not None), None)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return next((p for p in everyone if p is not None), None)
