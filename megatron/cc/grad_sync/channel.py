"""The contract of a dp or emb channel, which GradSync runs: every hook, a no-op by default.

A dp mode overrides the hooks it needs; a wrapper (HeteroDelay) forwards all of them.
Whether a channel overlaps its communication with backward is declared (`overlapped`), not
inferred from it having a `begin`: every channel has one.
"""


class SyncChannel:
    group = None
    """Process group a synchronous channel blocks on (GradSync times its call when the group
    has 2+ ranks); None: nothing to wait for, or the channel times its own waits."""
    overlapped = False
    """True: `begin` arms hooks that post the communication during backward, __call__ waits
    for it, and the channel logs its own waits."""
    lockstep = True
    """False when replicas may be at different iterations (preduce, adpsgd)."""

    def begin(self, model, iteration: int) -> None:
        """Before forward/backward of an iteration."""

    def __call__(self, model, iteration: int) -> None:
        """After backward, before the optimizer step."""
        raise NotImplementedError

    def after_optimizer_step(self, model, iteration: int) -> None:
        """After the optimizer step: where parameter-syncing dp modes exchange."""

    def flush(self, model) -> None:
        """End of training: apply whatever is still in flight."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass
