"""Name the collective a failed rank was in: gloo's timeout says only "recv operation".

    msg = describe_collective_failure(exc)   # None when the error did not come from c10d

A rank whose peer stopped answering fails after --distributed-timeout-minutes with an error
from deep inside torch.distributed; this finds, in its traceback, the torch.distributed call
our code made (all_reduce, barrier, new_group, init_process_group...) and where, so the log
says which collective hung. (NCCL's watchdog names the op itself: "OpType=ALLREDUCE".)
"""
import os
import sysconfig
import traceback
from typing import Optional

_C10D_FILES = ("distributed_c10d.py", "c10d_logger.py", "rendezvous.py")
_TORCH_DIST = os.sep + os.path.join("torch", "distributed") + os.sep


def describe_collective_failure(exc: BaseException) -> Optional[str]:
    frames = traceback.extract_tb(exc.__traceback__)
    for i, f in enumerate(frames):
        if _TORCH_DIST in f.filename and os.path.basename(f.filename) in _C10D_FILES:
            entry = next((g for g in frames[i:] if os.path.basename(g.filename)
                          == "distributed_c10d.py"), f)
            caller = next((g for g in reversed(frames[:i]) if _is_ours(g.filename)), None)
            where = (f" called from {_short(caller.filename)}:{caller.lineno} ({caller.name})"
                     if caller else "")
            kind = "timed out" if _is_timeout(exc) else "failed"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"collective torch.distributed.{entry.name}{where} {kind}: {first[:300]}"
    if isinstance(exc, TimeoutError) and str(exc).startswith("start-up:"):
        return str(exc)   # our own start-up handshake (megatron.training.runtime.rendezvous)
    return None


def _is_ours(filename: str) -> bool:
    """Training code (ours or megatron-core's), not torch or the standard library."""
    return (os.sep + "torch" + os.sep) not in filename and \
        not filename.startswith(sysconfig.get_paths()["stdlib"])


def _short(filename: str) -> str:
    marker = os.sep + "site-packages" + os.sep
    return filename.split(marker, 1)[1] if marker in filename else os.path.relpath(filename)


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, TimeoutError) or "timed out" in text or "timeout" in text
