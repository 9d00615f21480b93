"""tools/plan_compression.py: `bytes` prints, line for line, what a real pretrain_gpt.py run logs
(one short torchrun at pp=2 x dp=2 with a codec on every channel); `plan` ranks candidates and
plots; bad input is refused with the flag (or YAML key) named."""
import os
import re

import pytest

from bench.runlog import run_pretrain
from tests.conftest import tiny_gpt_argv
from tests.distributed import free_port
from tools import plan_compression

# a codec on every channel: fixpoint-4 activations, CB rank 4 gradients, PowerSGD rank 4 on
# dp, fused embedding sync with PowerSGD rank 2 (no warm-ups in 3 iterations)
E2E = {"pipeline-model-parallel-size": 2, "train-iters": 3, "log-interval": 1,
       "micro-batch-size": 2, "global-batch-size": 8, "forward-compress-method": "fixpoint",
       "forward-bits": 4, "inter-grad-comp": True, "inter-grad-comp-rank": 4,
       "grad-comp": True, "grad-comp-rank": 4, "emb-comm-opt": True, "emb-grad-comp": True,
       "emb-grad-comp-rank": 2}
_CHANNEL = re.compile(r"((?:pp-fwd|pp-bwd|dp|emb) bytes: [\d.]+[KMG]?B \(x[\d.inf]+\))")


def _logged(log: str):
    """{iteration: [channel fields of its log line]}."""
    out = {}
    for line in log.splitlines():
        m = re.search(r" iteration\s+(\d+)/", line)
        if m:
            out[int(m.group(1))] = _CHANNEL.findall(line)
    return out


def _predicted(capsys, argv):
    assert plan_compression.main(argv) == 0
    return capsys.readouterr().out.strip().splitlines()


def test_bytes_equal_the_logged_bytes_of_a_real_run(tiny_corpus, capsys):
    argv = tiny_gpt_argv(tiny_corpus, **E2E)
    run = run_pretrain("plan-e2e", 4, argv, port=free_port(), timeout=300)
    logged = _logged(run.log)
    assert sorted(logged) == [1, 2, 3]
    for it in (1, 2, 3):   # the log counts iterations from 1, the codecs' policies from 0
        predicted = _predicted(capsys, ["bytes", "--world-size", "4", "--iteration",
                                        str(it - 1), "--"] + argv)
        assert logged[it] == predicted, f"iteration {it}"
    assert [x.split(" bytes")[0] for x in predicted] == ["pp-fwd", "pp-bwd", "dp", "emb"]
    # and the ratios are real compression (the line is not trivially equal to raw)
    assert all("(x1.0)" not in x for x in predicted)
