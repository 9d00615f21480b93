"""Checkpoint files: written atomically with a checksum, read without running their pickle.

    write_file(obj, path)        path.tmp -> fsync -> os.replace; then path.sha256 ("<hex> <bytes>")
    verify_file(path)            None if path matches its .sha256 (without one: its zip CRCs),
                                 else a message naming it
    safe_load(path, trust)       torch.load(weights_only=True) with SAFE_GLOBALS allowed

A checkpoint holds tensors and plain Python data only, so `weights_only=True` reads it. A file
whose pickle asks for anything else (a class, a function: what a crafted file uses to run
code) is refused before any of it runs; `--trust-checkpoint` lifts that for files you made.
"""
import argparse
import hashlib
import os
import pickle
import zipfile
from typing import Optional

import numpy as np
import torch

DIGEST_SUFFIX = ".sha256"
_CHUNK = 8 << 20

# Checkpoints written before this module kept numpy's RNG state as an ndarray; allowing the
# ndarray reconstructor (data only: object arrays would need further, still refused globals)
# lets weights_only read them without --trust-checkpoint. argparse.Namespace: the `args` of
# Megatron-LM's layout (checkpoint_args), a plain attribute bag.
SAFE_GLOBALS = [np.ndarray, np.dtype, np._core.multiarray._reconstruct,
                type(np.dtype(np.uint32)), argparse.Namespace]


class CheckpointLoadError(RuntimeError):
    """A checkpoint file that is missing, corrupt or unsafe; the message names it."""


class _HashingWriter:
    """File wrapper that hashes what torch.save streams through it (no second read)."""

    def __init__(self, f):
        self.f, self.hash, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.hash.update(b)
        self.size += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def write_file(obj, path: str) -> None:
    """torch.save `obj` to `path` atomically and record its checksum next to it."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        w = _HashingWriter(f)
        torch.save(obj, w)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    write_digest(path, w.hash.hexdigest(), w.size)


def write_digest(path: str, hexdigest: str, size: int) -> None:
    tmp = path + DIGEST_SUFFIX + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{hexdigest} {size}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path + DIGEST_SUFFIX)
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    """Make a rename in `path` durable (a crash after os.replace may otherwise undo it)."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


def verify_file(path: str) -> Optional[str]:
    """None when `path` exists and matches its recorded checksum, else why not (naming it).

    A file without a .sha256 (written before checksums existed, or by Megatron-LM) is checked
    against the CRCs of its zip archive instead, so that a truncated or damaged copy is
    refused here, by name, rather than by torch.load's nameless zip error.
    """
    if not os.path.isfile(path):
        return f"{path} is missing"
    sidecar = path + DIGEST_SUFFIX
    if not os.path.isfile(sidecar):
        return verify_archive(path)
    try:
        want, size = open(sidecar).read().split()
        size = int(size)
    except ValueError:
        return f"{sidecar} is not a checksum file (expected '<sha256> <bytes>')"
    have = os.path.getsize(path)
    if have != size:
        return f"{path} is truncated or overwritten: {have} bytes, its checksum file says {size}"
    if file_digest(path) != want:
        return f"{path} is corrupt: its sha256 does not match {os.path.basename(sidecar)}"
    return None


_ZIP_MAGIC = b"PK\x03\x04"


def verify_archive(path: str) -> Optional[str]:
    """None when `path`, a torch.save zip archive, is complete and every member matches its
    CRC, else why not. A file that is not a zip archive (torch's legacy format) passes."""
    with open(path, "rb") as f:
        if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            return None
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError):
        return (f"{path} is corrupt or truncated: {size} bytes, not a complete zip archive "
                f"(no {os.path.basename(path)}{DIGEST_SUFFIX} to compare against)")
    if bad is not None:
        return (f"{path} is corrupt: its member {bad} fails its CRC check (no "
                f"{os.path.basename(path)}{DIGEST_SUFFIX} to compare against)")
    return None


def safe_load(path: str, trust: bool = False):
    """torch.load on CPU; without `trust`, only tensors, plain data and SAFE_GLOBALS."""
    try:
        if trust:
            return torch.load(path, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, OSError, RuntimeError) as e:
        # what torch raises on a damaged archive (which of them depends on where it is cut)
        if (isinstance(e, RuntimeError) and "PytorchStreamReader" not in str(e)
                or isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError))):
            raise
        first = str(e).splitlines()[0][:200] if str(e) else ""
        raise CheckpointLoadError(   # torch's own message names no file
            f"{path} is corrupt or truncated and cannot be loaded "
            f"({type(e).__name__}: {first})") from None
    except pickle.UnpicklingError as e:
        lines = [l for l in str(e).splitlines() if "GLOBAL" in l or "Unsupported" in l]
        reason = lines[0].strip() if lines else type(e).__name__
        raise CheckpointLoadError(
            f"{path} needs arbitrary unpickling, refused so that none of its code runs "
            f"({reason[:200]}); if you made this file yourself and trust it, pass "
            f"--trust-checkpoint") from None
