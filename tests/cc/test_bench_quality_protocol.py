"""bench/quality_protocol.py: the grid and its run ids, resume, the report's arithmetic on fake
logs, the scheduler, and one real tiny run (2 ranks, 3 iterations) through the runner."""
import json
import os
import sys
import threading
import time

import pytest

from tests.distributed import free_port

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import quality_corpora as qc  # noqa: E402
import quality_protocol as qp  # noqa: E402

ALL = list(qc.CORPORA)


def fake_log(valid: float, lines=(), iters: int = 2) -> str:
    """Megatron's iteration and validation lines; `lines`: the bytes fields per line."""
    out = []
    for i, fields in enumerate(lines or [""] * iters, 1):
        out.append(f" iteration {i:8d}/{len(lines or [0] * iters):8d} | elapsed time per iteration "
                   f"(ms): 10.0 | lm loss: 6.000000E+00 |{fields}")
    out.append(f" validation loss at iteration {len(out)} | lm loss value: {valid:.6E} |")
    return "\n".join(out) + "\n"


def fake_result(job, valid, lines=()):
    return qp.result_of(job, fake_log(valid, lines), 0, 1.0, ["cmd"], 2)


def test_default_grid():
    jobs = qp.build_grid(qp.select_methods(None), ALL, list(qp.CLAIM_SEEDS),
                         list(qp.DEFAULT_SHAPES), 300)
    ids = [j.run_id for j in jobs]
    # demo: 3 corpora x (2 seeds x (2 pp + 4 dp) + 11 seed methods) + 2 corpora x 4 runs on
    # a cut training split; large: 2 corpora x 6
    assert len(ids) == len(set(ids)) == 3 * (2 * 6 + 11) + 2 * 4 + 2 * 6 == 89
    assert {j.corpus for j in jobs if j.setting == "seed-epochs"} == {"code", "markov"}
    warm = [j for j in jobs if j.warm]
    assert len(warm) == 8 and jobs[:8] == warm          # 3 corpora x 2 seeds + 2 large, first
    assert not any(j.shape == "large" and j.corpus == "markov" for j in jobs)
    by = {j.run_id: j for j in jobs}
    # claim methods and references on every seed at the demo shape, on the first at large;
    # seed methods on the first seed at the demo shape only
    for seed in qp.CLAIM_SEEDS:
        assert qp.run_id("allreduce", "markov", seed, "demo", 300) in by
        assert (qp.run_id("subspace-default", "code", seed, "large", 300) in by) == \
            (seed == qp.CLAIM_SEEDS[0])
    assert qp.run_id(qp.DILOCO_RECIPE, "embedded", 1234, "large", 300) in by
    assert qp.run_id("cb16-lep", "code", 1234, "demo", 300) in by
    assert qp.run_id("cb16-lep", "code", 4321, "demo", 300) not in by
    assert not any(j.setting == "seed" and j.shape == "large" for j in jobs)
    d = by[qp.run_id(qp.DILOCO_RECIPE, "code", 4321, "demo", 300)]
    assert d.nproc == 4 and d.deps == [qp.warm_id("code", 4321, "demo", 300)]
    # imported rows, not copies; later flags win: the shape's
    assert d.flags[-len(qp.SHAPES["demo"]):] == qp.SHAPES["demo"]
    import bench_dp_modes
    flags = d.flags[:-len(qp.SHAPES["demo"])]
    assert flags[-len(bench_dp_modes.RUNS[qp.DILOCO_RECIPE]):] == bench_dp_modes.RUNS[qp.DILOCO_RECIPE]
    big = by[qp.run_id("pp-baseline", "embedded", 1234, "large", 300)]
    assert qp.params("large") >= 4 * qp.params("demo") and big.nproc == 2


def test_epochs_setting_trains_on_a_cut_split_seen_several_times(tmp_path):
    """seed-epochs: the corpus cut to the first training documents (held-out ones kept), so the
    run's samples pass over it about SEED_EPOCHS times and delta codecs meet samples again."""
    assets = qc.corpus_assets("markov", str(tmp_path), seed=3, max_bytes=60_000)
    job = next(j for j in qp.build_grid(qp.select_methods("acsgd-delta-4-epochs"), ["markov"],
                                        [1], ["tiny"], 20) if j.method == "acsgd-delta-4-epochs")
    assert "--repeat-epoch" in job.flags and job.setting == "seed-epochs"
    n = qp.cut_documents(job, assets, qp.SEED_EPOCHS)
    tokens = 20 * qp.SEED_BATCH * 32   # iterations x global batch x the tiny shape's sequence
    per_doc = assets["num_tokens"] / assets["num_documents"]
    assert n == -(-tokens // (qp.SEED_EPOCHS * per_doc)) and 1 <= n < assets["train_documents"]
    cmd = qp.job_command(job, assets, str(tmp_path / "out"), 29999)
    prefix = cmd[cmd.index("--data-path") + 1]
    assert cmd[cmd.index("--split") + 1] == f"{n},{assets['valid_documents']},0"
    assert os.path.dirname(prefix) == os.path.join(assets["directory"], f"train-{n}")
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    full, cut = IndexedDataset(assets["data_prefix"]), IndexedDataset(prefix)
    v = assets["valid_documents"]
    # the same token ids: the first n training documents, then every held-out one
    keep = list(range(n)) + list(range(len(full) - v, len(full)))
    assert len(cut) == n + v
    assert all((cut[i] == full[j]).all() for i, j in enumerate(keep))
    # the corpus's vocabulary and fingerprint (a run on the cut is a run on the corpus)
    assert cmd[cmd.index("--vocab-file") + 1] == assets["vocab_file"]
    assert qp.job_command(job, assets, str(tmp_path / "out"), 29999) == cmd   # cached
    with pytest.raises(ValueError, match="only the code and markov"):
        qc.subset_assets({"corpus": "embedded"}, 3)


def test_only_filters_and_commands(tmp_path):
    assert qp.select_methods("subspace*") == ["pp-baseline", "subspace-default"]
    assert qp.METHODS["subspace-default"].flags == ("--forward-compress-method", "subspace")
    # settings around a claim (the frontier) run when named, never by a glob or by default
    assert qp.select_methods("subspace-k24-b4") == ["pp-baseline", "subspace-k24-b4"]
    assert "subspace-k24-b4" not in qp.select_methods(None)
    assert qp.select_methods("sc,fe") == ["seed-baseline", "fe", "sc"]
    with pytest.raises(SystemExit):
        qp.select_methods("nothing-like-this")
    jobs = qp.build_grid(qp.select_methods("sparseloco*"), ["markov"], [7, 8], ["demo"], 20)
    assert sorted(j.method for j in jobs) == ["allreduce"] * 2 + ["sparseloco-H15-d1.56-2b-dpadam"] * 2 + ["warm"] * 2
    assets = {"data_prefix": "P", "vocab_file": "V", "merge_file": "M", "split": "9,1,0"}
    run = next(j for j in jobs if j.method == "allreduce" and j.seed == 8)
    cmd = qp.job_command(run, assets, str(tmp_path), 29999)
    tail = cmd[cmd.index("--data-path"):]
    assert tail[:8] == ["--data-path", "P", "--vocab-file", "V", "--merge-file", "M", "--split",
                        "9,1,0"]
    assert cmd[cmd.index("--seed", cmd.index("--data-path")) + 1] == "8"
    assert cmd[cmd.index("--load") + 1] == str(tmp_path / qp.warm_id("markov", 8, "demo", 20) / "ckpt")
    warm = next(j for j in jobs if j.warm and j.seed == 8)
    wcmd = qp.job_command(warm, assets, str(tmp_path), 29999)
    assert "--save" in wcmd and "--load" not in wcmd
    assert qp.tuned_mark("subspace-k10-b4", "embedded", "demo") == "TUNED"
    assert qp.tuned_mark("subspace-k10-b4", "embedded", "large") == "corpus"
    assert qp.tuned_mark(qp.DILOCO_RECIPE, "code", "demo") == ""
    assert qp.tuned_mark("sparseloco-H15-d1.56-2b-dpadam", "embedded", "demo") == ""
    assert qp.default_jobs(0, 2) == 1 and qp.default_jobs(0, 16) == 8 and qp.default_jobs(3, 16) == 3


def test_dry_run_prints_grid_and_cost(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(qp.quality_corpora, "corpus_assets", lambda *a, **k: {"fingerprint": "f"})
    assert qp.main(["--dry-run", "--out", str(tmp_path), "--only", "fe", "--corpora", "code",
                    "--shapes", "demo"]) == 0
    out = capsys.readouterr().out
    assert "fe__code__s1234__demo__i300" in out and "seed-baseline__code__s1234__demo__i300" in out
    assert "2 runs (2 to run, 0 warm starts)" in out and "core-hours" in out


def test_report_arithmetic_and_logged_ratios(tmp_path):
    out = str(tmp_path)
    jobs = {j.run_id: j for j in qp.build_grid(qp.select_methods("subspace*,sparseloco*"),
                                               ["code"], [1, 2], ["demo"], 4)}
    def put(method, seed, valid, lines=()):
        job = jobs[qp.run_id(method, "code", seed, "demo", 4)]
        os.makedirs(os.path.join(out, job.run_id))
        qp.write_json(os.path.join(out, job.run_id, qp.RESULT), fake_result(job, valid, lines))
    put("pp-baseline", 1, 5.0, [" pp-fwd bytes: 2.000MB (x1.0) |"] * 2)
    put("pp-baseline", 2, 4.0, [" pp-fwd bytes: 2.000MB (x1.0) |"] * 2)
    put("subspace-default", 1, 5.1, [" pp-fwd bytes: 2.000MB (x1.0) |",
                                    " pp-fwd bytes: 20.16KB (x101.6) | pp-bwd bytes: 20.16KB (x100.0) |"])
    put("subspace-default", 2, 4.02, [" pp-fwd bytes: 20.16KB (x99.6) |"] * 2)
    put("allreduce", 1, 3.0, [" dp bytes: 4.000MB (x1.0) |"] * 2)
    # dp sent every other line: bytes averaged over the run, ratio = raw / sent
    put("sparseloco-H15-d1.56-2b-dpadam", 1, 3.3, [" dp bytes: 4.000KB (x1000.0) |", ""])
    rows = {r["method"]: r for r in qp.summarize(qp.load_results(out))}
    sub = rows["subspace-default"]
    assert sub["gaps"] == pytest.approx([0.02, 0.005])
    assert sub["mean_gap"] == pytest.approx(0.0125) and sub["worst_gap"] == pytest.approx(0.02)
    assert sub["mean_ratio"]["pp-fwd"] == pytest.approx((101.6 + 99.6) / 2)   # last line's
    assert sub["mean_ratio"]["pp-bwd"] == pytest.approx(100.0)
    assert rows["pp-baseline"]["mean_gap"] == 0
    sl = rows["sparseloco-H15-d1.56-2b-dpadam"]
    assert sl["mean_gap"] == pytest.approx(0.1) and sl["seeds"] == [1]
    assert sl["mean_ratio"]["dp"] == pytest.approx(1000.0)
    res = qp.load_json(os.path.join(out, qp.run_id("sparseloco-H15-d1.56-2b-dpadam", "code", 1,
                                                   "demo", 4), qp.RESULT))
    assert res["bytes_per_iter"]["dp"] == pytest.approx(2048.0)
    text = qp.write_report(out, str(tmp_path / "no-cache"))
    assert (tmp_path / "README.md").read_text() == text
    line = next(ln for ln in text.splitlines() if ln.startswith("| subspace-default |"))
    assert "+1.25%" in line and "+2.00%" in line and "pp-fwd x100.6, pp-bwd x100.0" in line
    assert "| 1,2 |" in line
    assert "hardware:" in text and "- reproduce (" in text
    # the pivot: one line per (method, shape), the worst gap per corpus and over all
    pivot = next(ln for ln in text.split("By corpus")[1].splitlines()
                 if ln.startswith("| subspace-default |"))
    assert pivot.startswith("| subspace-default | demo | pp-fwd x100.6, pp-bwd x100.0 | ")
    assert "+2.00% (2 seeds, tuned)" in pivot and pivot.endswith("| **+2.00%** |")
    assert "| sparseloco-H15-d1.56-2b-dpadam | demo | dp x1000.0 | +10.00% (1 seed) |" in text
    assert "| pp-baseline | demo |" not in text.split("By corpus")[1]
    # a run and its reference on two builds of one corpus are not compared
    for method, fp in (("pp-baseline", "aaa"), ("subspace-default", "bbb")):
        path = os.path.join(out, qp.run_id(method, "code", 1, "demo", 4), qp.RESULT)
        qp.write_json(path, {**qp.load_json(path), "corpus_fingerprint": fp})
    sub = {r["method"]: r for r in qp.summarize(qp.load_results(out))}["subspace-default"]
    assert sub["gaps"] == pytest.approx([0.005]) and sub["other_build"] == [
        qp.run_id("subspace-default", "code", 1, "demo", 4)]
    assert "Not compared" in qp.report(out, str(tmp_path / "no-cache"))


def test_reproduce_line_leaves_out_paths_ports_and_parallelism(tmp_path):
    argv = ["--jobs", "2", "--shapes", "demo", "--only", "cocktail", "--out", "/x/results",
            "--cache-dir=/x/cache", "--port", "29950", "--cores", "8", "--seeds", "1"]
    assert qp.reproduce_argv(argv) == "--shapes demo --only cocktail --seeds 1"
    out = str(tmp_path)
    for method, valid in (("seed-baseline", 5.0), ("cocktail", 5.1)):
        job = qp.build_grid([method], ["code"], [1], ["demo"], 4)[0]
        os.makedirs(os.path.join(out, job.run_id))
        qp.write_json(os.path.join(out, job.run_id, qp.RESULT),
                      {**fake_result(job, valid), "protocol_argv": argv})
    text = qp.report(out, str(tmp_path / "none"))
    assert ("- reproduce (one invocation a line; add `--jobs N` to run N side by side):\n"
            "  - `python bench/quality_protocol.py --shapes demo --only cocktail --seeds 1`\n"
            "\n") in text


def test_report_flags_tuned_rows(tmp_path):
    out = str(tmp_path)
    for method, valid in (("pp-baseline", 5.0), ("subspace-k10-b4", 5.05)):
        job = qp.build_grid([method], ["embedded"], [1234], ["demo"], 4)[0]
        os.makedirs(os.path.join(out, job.run_id))
        qp.write_json(os.path.join(out, job.run_id, qp.RESULT), fake_result(job, valid))
    text = qp.report(out, str(tmp_path / "none"))
    line = next(ln for ln in text.splitlines() if ln.startswith("| subspace-k10-b4 |"))
    assert "**TUNED**" in line and "+1.00%" in line


def _fake_runner(record, lock, sleep=0.0):
    state = {"now": 0}

    def runner(job, assets, out, port, gpu, cores=1):
        with lock:
            state["now"] += 1
            record.append(("start", job.run_id, state["now"], port))
        time.sleep(sleep)
        d = os.path.join(out, job.run_id)
        os.makedirs(d, exist_ok=True)
        res = fake_result(job, 5.0)
        qp.write_json(os.path.join(d, qp.RESULT), res)
        with lock:
            state["now"] -= 1
            record.append(("end", job.run_id, state["now"], port))
        return res
    return runner


def test_resume_skips_finished_and_redoes_cut_short(tmp_path):
    out = str(tmp_path)
    jobs = qp.build_grid(qp.select_methods("fe"), ["code"], [1], ["demo"], 4)
    done, cut = jobs   # seed-baseline (finished), fe (cut short: a log, a half-written result)
    os.makedirs(os.path.join(out, done.run_id))
    qp.write_json(os.path.join(out, done.run_id, qp.RESULT), fake_result(done, 5.0))
    os.makedirs(os.path.join(out, cut.run_id))
    open(os.path.join(out, cut.run_id, qp.LOG), "w").write("half a log")
    open(os.path.join(out, cut.run_id, qp.RESULT + ".tmp"), "w").write("{\"half")
    record, lock = [], threading.Lock()
    status = qp.run_grid(jobs, {"code": {}}, out, 2, 8, runner=_fake_runner(record, lock),
                         log=lambda s: None)
    assert status == {done.run_id: "done", cut.run_id: "done"}
    assert [r[1] for r in record if r[0] == "start"] == [cut.run_id]
    record.clear()
    qp.run_grid(jobs, {"code": {}}, out, 2, 8, runner=_fake_runner(record, lock),
                log=lambda s: None)
    assert record == []


def test_a_run_on_another_build_of_its_corpus_runs_again(tmp_path):
    out = str(tmp_path)
    jobs = qp.build_grid(qp.select_methods("fe"), ["code"], [1], ["demo"], 4)
    for job, fp in zip(jobs, ("old", None)):   # seed-baseline: another build; fe: not recorded
        os.makedirs(os.path.join(out, job.run_id))
        qp.write_json(os.path.join(out, job.run_id, qp.RESULT),
                      {**fake_result(job, 5.0), "corpus_fingerprint": fp})
    assert qp.done_runs(out, jobs) == {j.run_id for j in jobs}          # no build at hand
    assert qp.done_runs(out, jobs, {"code": "new"}) == set()
    assert qp.done_runs(out, jobs, {"code": "old"}) == {jobs[0].run_id}
    record, lock = [], threading.Lock()
    qp.run_grid(jobs, {"code": {"fingerprint": "new"}}, out, 1, 8,
                runner=_fake_runner(record, lock), log=lambda s: None)
    assert sorted(r[1] for r in record if r[0] == "start") == sorted(j.run_id for j in jobs)


def test_warm_start_without_its_checkpoint_runs_again_before_its_runs(tmp_path, monkeypatch):
    """Checkpoints are not kept in git: a fresh clone has a warm start's result but not its
    checkpoint, and a run loading it would train from scratch after a warning."""
    out = str(tmp_path)
    jobs = qp.build_grid(qp.select_methods("allreduce"), ["code"], [1], ["demo"], 4)
    warm, run = jobs
    assert warm.warm and run.deps == [warm.run_id]
    os.makedirs(os.path.join(out, warm.run_id))
    qp.write_json(os.path.join(out, warm.run_id, qp.RESULT), fake_result(warm, 5.0))
    assert qp.done_runs(out, jobs) == set()
    assert "2 runs (2 to run" in qp.dry_run_text(jobs, out, 1, 8, 0, 1e10)
    # and a run started anyway refuses, naming the warm start
    res = qp.run_job(run, {}, out, 29999)
    assert res["final_valid"] is None and warm.run_id in res["error"]
    assert os.listdir(os.path.join(out, run.run_id)) == [qp.FAILED]
    # with the checkpoint the warm start is done; once its runs are done it is not needed
    ckpt = os.path.join(out, warm.run_id, "ckpt")
    os.makedirs(ckpt)
    open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w").write("4")
    assert qp.done_runs(out, jobs) == {warm.run_id}
    os.makedirs(os.path.join(out, run.run_id), exist_ok=True)
    qp.write_json(os.path.join(out, run.run_id, qp.RESULT), fake_result(run, 5.0))
    import shutil
    shutil.rmtree(ckpt)
    assert qp.done_runs(out, jobs) == {warm.run_id, run.run_id}


def test_run_job_wipes_a_cut_short_run_and_writes_atomically(tmp_path, monkeypatch):
    out = str(tmp_path)
    job = qp.build_grid(["pp-baseline"], ["code"], [1], ["tiny"], 2)[0]
    d = tmp_path / job.run_id
    d.mkdir()
    (d / "ckpt").mkdir()
    (d / (qp.RESULT + ".tmp")).write_text("{")
    log = fake_log(4.5, [" pp-fwd bytes: 1.000KB (x2.0) |"] * 2)
    monkeypatch.setattr(qp, "job_command", lambda *a, **k: [
        sys.executable, "-c", f"import sys; sys.stdout.write({log!r})"])
    res = qp.run_job(job, {}, out, 29999)
    assert res["final_valid"] == 4.5 and res["ratio"] == {"pp-fwd": 2.0}
    assert sorted(os.listdir(d)) == [qp.CMD, qp.LOG, qp.RESULT]
    # a failed run leaves failed.json, not result.json: retried next time, listed in the report
    monkeypatch.setattr(qp, "job_command", lambda *a, **k: [
        sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    res = qp.run_job(job, {}, out, 29999)
    assert res["returncode"] == 3 and sorted(os.listdir(d)) == [qp.CMD, qp.FAILED, qp.LOG]
    assert not qp.is_done(out, job) and "rc 3" in qp.report(out, str(tmp_path / "none"))


def test_scheduler_limits_ranks_and_waits_for_warm_start(tmp_path):
    jobs = qp.build_grid(qp.select_methods("pp-baseline,sparseloco*"), ["code"], [1, 2],
                         ["demo"], 4)
    record, lock = [], threading.Lock()
    # 8 cores: two 4-rank runs or four 2-rank runs at once
    status = qp.run_grid(jobs, {"code": {}}, str(tmp_path), 4, 8,
                         runner=_fake_runner(record, lock, 0.05), log=lambda s: None)
    assert set(status.values()) == {"done"} and len(status) == len(jobs)
    ranks, peak = 0, 0
    nproc = {j.run_id: j.nproc for j in jobs}
    for kind, rid, _, _ in record:
        ranks += nproc[rid] if kind == "start" else -nproc[rid]
        peak = max(peak, ranks)
    assert 4 <= peak <= 8
    order = [r[1] for r in record]
    for j in jobs:
        for dep in j.deps:
            assert order.index(dep) < order.index(j.run_id)
            assert ("end", dep) in [(k, r) for k, r, _, _ in record[:order.index(j.run_id)]]
    # concurrent runs got different ports
    live = {}
    for kind, rid, _, port in record:
        if kind == "start":
            assert port not in live.values()
            live[rid] = port
        else:
            live.pop(rid)


def test_tiny_end_to_end_run(tmp_path):
    """One real run through the runner: 2 ranks (tp 1 x pp 2), the tiny shape, 3 iterations,
    on a tiny Markov corpus; then the report; then a second invocation skips it."""
    assets = qc.corpus_assets("markov", str(tmp_path / "cache"), seed=3, max_bytes=60_000,
                              vocab_size=320, words=64, branching=4)
    out = str(tmp_path / "out")
    jobs = qp.build_grid(["pp-baseline"], ["markov"], [1234], ["tiny"], 3)
    logs = []
    status = qp.run_grid(jobs, {"markov": assets}, out, 1, 2, base_port=free_port(),
                         log=logs.append)
    rid = jobs[0].run_id
    assert status == {rid: "done"}, open(os.path.join(out, rid, qp.LOG)).read()[-3000:]
    res = json.load(open(os.path.join(out, rid, qp.RESULT)))
    assert res["final_valid"] > 0 and res["ratio"]["pp-fwd"] == 1.0 and res["nproc"] == 2
    assert "--split" in open(os.path.join(out, rid, qp.CMD)).read()
    text = qp.write_report(out, str(tmp_path / "cache"))
    assert f"| pp-baseline | markov | tiny | 3 | 1234 |  | +0.00% | +0.00% | {res['final_valid']:.4f} |" in text
    assert qp.run_grid(jobs, {"markov": assets}, out, 1, 2, log=logs.append) == {rid: "done"}
    assert logs[-1] == f"skip {rid} (done)"
