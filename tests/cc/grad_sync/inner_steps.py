"""Driving a DiLoCo-style sync as the trainer does, with random local 'inner steps' standing
in for the optimizer: shared by the SparseLoCo and low-rank DiLoCo tests."""
import torch


def drive(sync, model, gen, iters, start=0, record=None):
    """The sync hooks around a random step per iteration (replica-local: `gen` differs per
    rank). record: per iteration, the pseudo-gradient of every fragment just before the sync
    hook and the error buffers just after it."""
    from megatron.cc.grad_sync.param_sync import flatten
    for it in range(start, start + iters):
        sync(model, it)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
        if record is not None:
            delta = [g - flatten(f) for g, f in zip(sync.global_copy, sync._fragments(model))]
        sync.after_optimizer_step(model, it)
        if record is not None:
            record.append((delta, [None if e is None else e.clone() for e in sync.residual]))


def final_after_resume(make, model, gen, split, iters=12):
    """The flat parameters after `iters` driven iterations, the sync saved after `split` and
    a fresh one (`make()`) loaded from it for the rest (split >= iters: straight through)."""
    from megatron.cc.grad_sync.param_sync import flatten
    sync = make()
    drive(sync, model, gen, min(split, iters))
    if split < iters:
        sd = sync.state_dict()
        sync = make()
        sync.load_state_dict(sd)
        drive(sync, model, gen, iters - split, start=split)
    sync.flush(model)
    return flatten(list(model.parameters()))


def moves_then_syncs(sync, model, gen, iters):
    """Per iteration a random move (0.1 randn, replica-local), then the sync hook: the flat
    moves, the flat parameters after each hook and the dp bytes each hook counted."""
    from megatron.cc.grad_sync.param_sync import flatten
    moves, after, sent = [], [], []
    for it in range(iters):
        step = [0.1 * torch.randn(p.shape, generator=gen) for p in model.parameters()]
        with torch.no_grad():
            for p, d in zip(model.parameters(), step):
                p.sub_(d)
        moves.append(flatten(step))
        sync.stats.reset()
        sync.after_optimizer_step(model, it)
        sent.append(sync.stats.snapshot().get("dp", {"sent": 0})["sent"])
        after.append(flatten(list(model.parameters())).clone())
    return torch.stack(moves), torch.stack(after), sent
