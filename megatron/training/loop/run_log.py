"""The run's own directory: --experiment-name (Optimus-CC's --experiment_name) names it.

    runs/<experiment-name>/            (or <--tensorboard-dir>/<experiment-name>/)
        log.txt                        every iteration and validation line of the last rank
        events.out.tfevents.*          TensorBoard scalars

Without --experiment-name, TensorBoard goes to --tensorboard-dir itself and no log file is
written. Only the last rank (which holds the loss) writes.
"""
import os
from typing import Optional

DEFAULT_ROOT = "runs"


def run_dir(logging_args) -> Optional[str]:
    """Directory of this run's log and TensorBoard files, or None (no file logging)."""
    name, tb = logging_args.experiment_name, logging_args.tensorboard_dir
    if name:
        return os.path.join(tb or DEFAULT_ROOT, name)
    return tb


class RunLog:
    """Appends log lines to <run dir>/log.txt on the writing rank; a no-op elsewhere."""

    def __init__(self, logging_args, writer_rank: bool):
        self.path = None
        d = run_dir(logging_args)
        if writer_rank and logging_args.experiment_name and d:
            os.makedirs(d, exist_ok=True)
            self.path = os.path.join(d, "log.txt")

    def write(self, text: str) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:   # line-sized appends: a crash keeps what was logged
                f.write(text.rstrip("\n") + "\n")
