"""pretrain_gpt.py with one injected fault, for the restart/timeout tests (run by torchrun).

    FAULT=kill          rank FAULT_RANK SIGKILLs itself after iteration FAULT_AT (first attempt only)
    FAULT=hang          rank FAULT_RANK sleeps FAULT_SLEEP s before iteration FAULT_AT + 1
    FAULT=hang_startup  rank FAULT_RANK sleeps FAULT_SLEEP s before process-group creation
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pretrain_gpt  # noqa: E402
from megatron.training import training  # noqa: E402

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

if mine and FAULT == "hang_startup":
    from megatron.training import initialize
    init = initialize.initialize_distributed

    def late_init(args):
        time.sleep(SLEEP)
        return init(args)

    initialize.initialize_distributed = late_init

if __name__ == "__main__":
    sys.exit(pretrain_gpt.main())
