"""HeteroDelay (--hetero) forwards the whole dp channel contract (SyncChannel), so a wrapped
overlapped channel still overlaps: `--hetero 0.5 --overlap-grad-reduce` logs its "dp wait ms"
(before the fix `begin` never reached the wrapped channel, which then ran synchronously and
untimed, so the log line had no dp wait at all).
"""
import inspect

from megatron.cc.grad_sync.channel import SyncChannel
from megatron.cc.data_parallel.hetero import HeteroDelay
from tests.conftest import tiny_gpt_argv
from tests.distributed import run_distributed
from tests.training import runner

# every hook of the contract, found on the class: a hook added later is checked too
HOOKS = sorted(n for n, v in vars(SyncChannel).items()
               if callable(v) and (n == "__call__" or not n.startswith("_")))
DECLARED = ("overlapped", "lockstep")


def _recording(name):
    def hook(self, *args):
        self.calls.append((name, args))
        return {"returned by": name}
    return hook


class Recorder(SyncChannel):
    overlapped, lockstep = "overlapped of the wrapped", "lockstep of the wrapped"
    locals().update({n: _recording(n) for n in HOOKS})

    def __init__(self):
        self.calls = []


def test_contract_is_what_grad_sync_calls():
    assert HOOKS == ["__call__", "after_optimizer_step", "begin", "flush", "load_state_dict",
                     "state_dict"]
    plain = SyncChannel()
    assert not plain.overlapped and plain.lockstep and plain.group is None
    assert plain.begin(None, 0) is None and plain.state_dict() == {}


def test_hetero_delay_forwards_every_hook():
    inner = Recorder()
    wrapped = HeteroDelay(inner, 0.0, seed=1, dp_rank=0)   # fraction 0: no sleep
    for name in HOOKS:
        args = tuple(f"arg{i}" for i in
                     range(len(inspect.signature(getattr(SyncChannel, name)).parameters) - 1))
        getattr(wrapped, name)(*args)
        assert inner.calls[-1] == (name, args), name
    assert len(inner.calls) == len(HOOKS)
    assert wrapped.state_dict() == {"returned by": "state_dict"}
    for name in DECLARED:
        assert getattr(wrapped, name) == getattr(inner, name), name
    assert wrapped.group is None   # its sleep is emulated compute: GradSync does not time it


def _overlap_worker(rank, world, corpus):
    import contextlib
    import io
    flags = {"hetero": 0.5, "overlap-grad-reduce": True, "ddp-bucket-size": 3000,
             "train-iters": 2, "num-layers": 2, "global-batch-size": 4}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        losses = runner.train(tiny_gpt_argv(corpus, **flags), world)
    return losses, [line for line in out.getvalue().splitlines() if " iteration " in line]


def test_hetero_with_overlap_grad_reduce_logs_dp_wait(tiny_corpus):
    losses, lines = run_distributed(_overlap_worker, 2, (tiny_corpus,), timeout=300)[-1]
    assert len(losses) == 2 and all(l == l for l in losses), losses
    assert len(lines) == 2, lines
    assert all("dp wait ms: " in line for line in lines), lines
