"""--diloco-capture-dir: every replica's pseudo-gradient at every sync, as the exchange saw it.

Two gloo ranks run exact DiLoCo (H = 2, outer lr 1, momentum 0) on a Linear whose weights
move randomly between syncs. At each sync the outer step moves the global copy by exactly
minus the mean of the two captured pseudo-gradients (each equal to theta_g - theta_i), the
files are named by iteration, fragment and rank, and no temporary file is left.
"""
import os

import torch
import torch.distributed as dist

from tests.distributed import by_value, run_distributed


def _worker(rank, world, directory):
    from megatron.cc.data_parallel.diloco_sync import DiLoCoSync
    from megatron.cc.grad_sync.param_sync import flatten
    from megatron.cc.common.stats import ChannelStats
    gen = torch.Generator().manual_seed(rank)
    lin = torch.nn.Linear(5, 3)
    for p in lin.parameters():
        dist.broadcast(p.data, 0)
    sync = DiLoCoSync(dist.group.WORLD, ChannelStats(), inner_steps=2, outer_lr=1.0,
                      outer_momentum=0.0, capture_dir=directory)
    sync(lin, 0)
    moves, deltas = [], []
    for it in range(4):
        with torch.no_grad():
            for p in lin.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        before = sync.global_copy[0].clone()
        deltas.append(before - flatten(list(lin.parameters())))
        sync.after_optimizer_step(lin, it)
        moves.append(sync.global_copy[0] - before)
    return by_value({"moves": torch.stack(moves), "deltas": torch.stack(deltas)})


def test_captured_pseudo_gradients_are_what_the_outer_step_averaged(tmp_path):
    d = str(tmp_path / "capture")
    os.makedirs(d)
    res = run_distributed(_worker, 2, args=(d,), timeout=120)
    names = sorted(os.listdir(d))
    assert names == [f"iter{i:07d}_frag0_rank{r}.pt" for i in (2, 4) for r in (0, 1)]
    for it in (1, 3):   # the syncs after iterations 2 and 4
        recs = [torch.load(os.path.join(d, f"iter{it + 1:07d}_frag0_rank{r}.pt"))
                for r in (0, 1)]
        assert [x["dp_rank"] for x in recs] == [0, 1] and recs[0]["dp_world"] == 2
        assert recs[0]["shapes"] == [(3, 5), (3,)] and recs[0]["iteration"] == it + 1
        for r in (0, 1):
            assert torch.equal(recs[r]["delta"], torch.as_tensor(res[r]["deltas"][it]))
        mean = (recs[0]["delta"] + recs[1]["delta"]) / 2
        move = torch.as_tensor(res[0]["moves"][it])
        assert torch.allclose(move, -mean, atol=1e-6)
        assert move.abs().max() > 0.1
