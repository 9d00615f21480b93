"""Which checkpoint --load picks: empty -> None, bad latest -> refused naming the file, or
--ckpt-fallback -> the newest earlier one that verifies, with a warning (one gloo rank)."""
import os

import torch

from tests.distributed import run_distributed


def _worker(rank, world, root):
    from megatron.training.checkpointing.checkpoint_io import write_file
    from megatron.training.checkpointing.checkpoint_select import LATEST, choose_checkpoint, iter_dir

    def files(it):
        return [os.path.join(iter_dir(root, it), "model_optim_rng.pt")]

    out = {"empty": choose_checkpoint(root, files, fallback=False)}
    for it in (2, 4):
        os.makedirs(iter_dir(root, it))
        write_file({"w": torch.full((64,), float(it))}, files(it)[0])
    os.makedirs(iter_dir(root, 6) + ".tmp")                # an unfinished save: never a candidate
    open(os.path.join(root, LATEST), "w").write("4")
    out["good"] = choose_checkpoint(root, files, fallback=False)
    with open(files(4)[0], "r+b") as f:                   # flip one byte of the latest
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    return _refused_then_fallback(root, files, out)


def test_choose_checkpoint(tmp_path):
    out = run_distributed(_worker, 1, (str(tmp_path / "ck"),), timeout=120)[0]
    assert out["empty"] is None and out["good"] == 4 and out["fallback"] == 2
    assert "iter_0000004/model_optim_rng.pt is corrupt" in out["refused"]
    assert "--ckpt-fallback" in out["refused"]
    assert len(out["logs"]) == 1 and "trying iteration 2" in out["logs"][0]


def _unchecked_worker(rank, world, root):
    """Files without a .sha256 (older saves, Megatron-LM's): a truncated one is refused by name."""
    from megatron.training.checkpointing.checkpoint_io import DIGEST_SUFFIX, write_file
    from megatron.training.checkpointing.checkpoint_select import LATEST, choose_checkpoint, iter_dir

    def files(it):
        return [os.path.join(iter_dir(root, it), "model_optim_rng.pt")]

    for it in (2, 4):
        os.makedirs(iter_dir(root, it))
        write_file({"w": torch.full((4096,), float(it))}, files(it)[0])
        os.remove(files(it)[0] + DIGEST_SUFFIX)
    open(os.path.join(root, LATEST), "w").write("4")
    out = {"good": choose_checkpoint(root, files, fallback=False)}
    data = open(files(4)[0], "rb").read()
    with open(files(4)[0], "wb") as f:                    # a save or copy cut short
        f.write(data[: len(data) // 2])
    return _refused_then_fallback(root, files, out)


def test_truncated_file_without_checksum_is_named(tmp_path):
    out = run_distributed(_unchecked_worker, 1, (str(tmp_path / "ck"),), timeout=120)[0]
    assert out["good"] == 4 and out["fallback"] == 2
    path = str(tmp_path / "ck" / "iter_0000004" / "model_optim_rng.pt")
    assert f"{path} is corrupt or truncated" in out.get("refused", ""), out
    assert "--ckpt-fallback" in out["refused"] and "PytorchStreamReader" not in out["refused"]
    assert len(out["logs"]) == 1 and "trying iteration 2" in out["logs"][0]


def test_damaged_files_without_checksum(tmp_path):
    """verify_file without a .sha256 checks the zip's CRCs; safe_load names the file too."""
    from megatron.training.checkpointing.checkpoint_io import (CheckpointLoadError, DIGEST_SUFFIX, safe_load,
                                                 verify_file, write_file)
    path = str(tmp_path / "model_optim_rng.pt")
    write_file({"w": torch.arange(4096.0)}, path)
    os.remove(path + DIGEST_SUFFIX)
    assert verify_file(path) is None
    data = bytearray(open(path, "rb").read())
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01                        # same size, tensor bytes changed
    open(path, "wb").write(bytes(flipped))
    assert f"{path} is corrupt" in (verify_file(path) or "")
    open(path, "wb").write(bytes(data[: len(data) // 2]))
    assert f"{path} is corrupt or truncated" in (verify_file(path) or "")
    try:
        safe_load(path)
    except CheckpointLoadError as e:
        assert str(e).startswith(f"{path} is corrupt or truncated"), e
    else:
        raise AssertionError("a truncated file loaded")


def _refused_then_fallback(root, files, out):
    """out + what choose_checkpoint says of the damaged latest without and with the fallback."""
    from megatron.training.checkpointing.checkpoint_io import CheckpointLoadError
    from megatron.training.checkpointing.checkpoint_select import choose_checkpoint
    try:
        choose_checkpoint(root, files, fallback=False)
    except CheckpointLoadError as e:
        out["refused"] = str(e)
    logs = []
    out["fallback"] = choose_checkpoint(root, files, fallback=True, log=logs.append)
    out["logs"] = logs
    return out
