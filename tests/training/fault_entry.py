"""pretrain_gpt.py with one injected fault, for the restart/timeout tests (run by torchrun).

    FAULT=kill          rank FAULT_RANK SIGKILLs itself after iteration FAULT_AT (first attempt only)
    FAULT=hang          rank FAULT_RANK sleeps FAULT_SLEEP s before iteration FAULT_AT + 1
    FAULT=hang_startup  rank FAULT_RANK sleeps FAULT_SLEEP s before process-group creation
    FAULT=sigterm       rank FAULT_RANK sends itself SIGTERM after iteration FAULT_AT
    FAULT=kill_in_save  rank FAULT_RANK SIGKILLs itself in the writer thread of the async
                        save of iteration FAULT_AT, after writing its first file
    LOSS_FILE=path      the last rank writes {"start": first iteration, "losses": [...]} there
                        (exact floats; one file per torchrun attempt: path.<attempt>)
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pretrain_gpt  # noqa: E402
from megatron.training.loop import training  # noqa: E402

FAULT, RANK = os.environ.get("FAULT"), int(os.environ.get("FAULT_RANK", "-1"))
AT, SLEEP = int(os.environ.get("FAULT_AT", "0")), float(os.environ.get("FAULT_SLEEP", "120"))
mine = FAULT and int(os.environ.get("RANK", "0")) == RANK \
    and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

if mine and FAULT in ("kill", "hang"):
    step = training.Trainer.train_step

    def faulty_step(self):
        if FAULT == "hang" and self.iteration == AT:
            time.sleep(SLEEP)
        out = step(self)
        if FAULT == "kill" and self.iteration == AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    training.Trainer.train_step = faulty_step

if mine and FAULT == "sigterm":
    step = training.Trainer.train_step

    def signalled_step(self):
        out = step(self)
        if self.iteration == AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    training.Trainer.train_step = signalled_step

if mine and FAULT == "kill_in_save":
    from megatron.training.checkpointing import async_save

    def dying_write(obj, path, _real=async_save.write_file):
        _real(obj, path)
        if f"iter_{AT:07d}.tmp" in path:
            os.kill(os.getpid(), signal.SIGKILL)   # kill -9 with the save half written

    async_save.write_file = dying_write

if os.environ.get("LOSS_FILE"):
    import json
    train = training.Trainer.train

    def recorded_train(self):
        start = self.iteration
        train(self)
        if int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            with open(f"{os.environ['LOSS_FILE']}.{attempt}", "w") as f:
                json.dump({"start": start, "losses": self.loss_history}, f)

    training.Trainer.train = recorded_train

if mine and FAULT == "hang_startup":
    from megatron.training.runtime import initialize
    init = initialize.initialize_distributed

    def late_init(args):
        time.sleep(SLEEP)
        return init(args)

    initialize.initialize_distributed = late_init

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
