"""bench/bench_slow_link.py without root: its parsing, its arithmetic and its clean-up."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_slow_link as bsl  # noqa: E402

# a log line as the training loop prints it (with --overlap-p2p-comm, pp=2)
LINE = (" iteration        3/       4 | consumed samples:           96 | elapsed time per "
        "iteration (ms): 6337.6 | learning rate: 1.000000E-04 | global batch size:    32 | "
        "lm loss: 8.005147E+00 | grad norm: 2.168 | number of skipped iterations:   0 | "
        "tokens/s: 1293 | pp-fwd bytes: 1.004MB (x8.0) | pp-bwd bytes: 640.000KB (x12.8) | "
        "pp-fwd wait ms: 300.7 | pp-bwd wait ms: 1049.1 | dp wait ms: 0.0 |")

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
mcc1x: 1000200     300    0    0    0     0          0         0  5000660     700    0    0    0     0       0          0
"""


def test_parse_line_reads_the_log_line_of_the_trainer():
    rec = bsl.parse_line(LINE)
    assert rec["iteration"] == 3 and rec["ms"] == 6337.6 and rec["loss"] == 8.005147
    assert rec["bytes"] == {"pp-fwd": 1.004 * 1024 ** 2, "pp-bwd": 640.0 * 1024}
    assert rec["wait_ms"] == {"pp-fwd": 300.7, "pp-bwd": 1049.1, "dp": 0.0}
    assert bsl.parse_line(" validation loss at iteration 3 | lm loss value: 1 |") is None


def test_the_line_format_is_the_one_stats_prints():
    """The bench parses ChannelStats.format's own output (exact to 0.1% at 3 decimals)."""
    from megatron.cc.common.stats import ChannelStats
    s = ChannelStats()
    s.add("pp-fwd", 1_052_672, 8 * 1_052_672)
    s.add_wait("pp-bwd", 0.25)
    text = ChannelStats.format(ChannelStats.merge([s.snapshot()]), iterations=1)
    rec = bsl.parse_line(" iteration 1/ 2 | elapsed time per iteration (ms): 5.0 | "
                         "lm loss: 1.0E+00 | " + text + " |")
    assert abs(rec["bytes"]["pp-fwd"] - 1_052_672) <= 1e-3 * 1_052_672
    assert rec["wait_ms"] == {"pp-bwd": 250.0}


def test_inter_node_counts_are_what_crossed_the_link():
    """Each side of the link is a node: the log's `<channel> inter-node bytes` are what
    crossed it, whichever channels they are (the subspace model's emb sync, say)."""
    line = LINE.replace(" |", " | emb bytes: 4.000MB (x2.0) | pp-fwd inter-node bytes: "
                        "1.004MB | emb inter-node bytes: 4.000MB | emb inter-node wait ms: 7.0 |",
                        1)
    rec = bsl.parse_line(line)
    assert rec["bytes"]["emb inter-node"] == 4 * 1024 ** 2
    assert rec["bytes"]["pp-fwd inter-node"] == rec["bytes"]["pp-fwd"] == 1.004 * 1024 ** 2
    assert rec["wait_ms"]["emb inter-node"] == 7.0 and rec["wait_ms"]["pp-fwd"] == 300.7
    lines = [dict(rec, iteration=i) for i in (1, 2, 3)]
    counters = {i: {"tx_bytes": 0, "tx_packets": 0, "rx_bytes": 0, "rx_packets": 0}
                for i in (1, 2, 3)}
    r = bsl.summarise(lines, counters, skip=1, crossing=("pp-fwd", "pp-bwd"))
    assert r["logged_bytes"] == (1.004 + 4) * 1024 ** 2   # pp-bwd stayed on one side here


def test_net_dev_and_wire_payload():
    c = bsl.parse_net_dev(NET_DEV, "mcc1x")
    assert c == {"rx_bytes": 1000200, "rx_packets": 300, "tx_bytes": 5000660, "tx_packets": 700}
    zero = dict.fromkeys(c, 0)
    assert bsl.wire_payload(zero, c) == 1000200 + 5000660 - 66 * 1000
    with pytest.raises(ValueError, match="no interface eth9"):
        bsl.parse_net_dev(NET_DEV, "eth9")
    with open("/proc/self/net/dev") as f:   # the live format parses too
        assert bsl.parse_net_dev(f.read(), "lo")["rx_bytes"] >= 0


def test_summarise_measures_between_two_followed_log_lines():
    lines = [{"iteration": i, "ms": ms, "loss": 9.0 - i, "bytes": {"pp-fwd": 100.0, "dp": 7.0},
              "wait_ms": {"pp-fwd": 2.0 * i}} for i, ms in [(1, 50), (2, 10), (3, 30), (4, 20),
                                                             (5, 999)]]
    counters = {i: {"tx_bytes": 1000 * i, "tx_packets": i, "rx_bytes": 0, "rx_packets": 0}
                for i in range(1, 6)}
    r = bsl.summarise(lines, counters, skip=1, crossing=("pp-fwd", "pp-bwd"))
    # iterations 2..4 (5 is followed by nothing): 3 iterations
    assert r["iterations"] == 3 and r["ms_per_iter"] == 20 and r["ms_min"] == 10
    assert r["wire_bytes"] == (3000 - 3 * 66) / 3 and r["logged_bytes"] == 100.0
    assert r["wait_ms"] == {"pp-fwd": 6.0} and r["final_loss"] == 4.0
    with pytest.raises(ValueError, match="raise --iters"):
        bsl.summarise(lines[:2], counters, skip=1, crossing=("dp",))


def test_flags_are_checked_before_anything_runs():
    assert bsl.parse_rates("none, 100mbit,20Mbit") == ["none", "100mbit", "20mbit"]
    assert bsl.rate_bits("20mbit") == 2e7 and bsl.rate_bits("none") == float("inf")
    for bad in ("fast", "100mb", ""):
        with pytest.raises(ValueError, match="--rates"):
            bsl.parse_rates(bad)
    with pytest.raises(ValueError, match="--configs: unknown"):
        bsl.parse_configs("uncompressed,zip")
    with pytest.raises(SystemExit, match="--rates"):
        bsl.main(["--rates", "100mb"])


def test_placement_puts_the_channel_under_test_across_the_link():
    # ranks: (stage, replica) = divmod(rank, dp); rank 0 (the rendezvous) always on side A
    assert [bsl.side_of(r, "pp", 1) for r in range(2)] == [0, 1]
    assert [bsl.side_of(r, "dp", 2) for r in range(4)] == [0, 1, 0, 1]
    assert [bsl.side_of(r, "both", 2) for r in range(4)] == [0, 1, 1, 0]
    # tp 2: a tensor-parallel pair stays on one side, the pipeline crosses
    assert [bsl.side_of(r, "pp-tp2", 1, 2) for r in range(4)] == [0, 0, 1, 1]


class FakeIp:
    """Records commands; fails the one containing `fail_on`."""

    def __init__(self, fail_on=None):
        self.cmds, self.fail_on = [], fail_on

    def __call__(self, cmd):
        self.cmds.append(" ".join(cmd))
        if self.fail_on and self.fail_on in cmd:
            raise subprocess.CalledProcessError(1, cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_namespaces_are_removed_when_setup_fails():
    ip = FakeIp(fail_on="veth")
    with pytest.raises(subprocess.CalledProcessError):
        with bsl.SlowLink(tag="t1", run=ip):
            pass
    assert ip.cmds[-2:] == ["ip netns del mcct1b", "ip netns del mcct1a"]


def test_namespaces_are_removed_on_ctrl_c_and_only_once():
    ip = FakeIp()
    link = bsl.SlowLink(tag="t2", run=ip)
    with pytest.raises(KeyboardInterrupt):
        with link:
            link.set_rate("20mbit")
            raise KeyboardInterrupt
    dels = [c for c in ip.cmds if "netns del" in c]
    assert dels == ["ip netns del mcct2b", "ip netns del mcct2a"]
    assert any("tbf rate 20mbit" in c for c in ip.cmds)
    link.close()   # the atexit call afterwards finds nothing left to delete
    assert [c for c in ip.cmds if "netns del" in c] == dels


def test_slow_start_after_idle_is_set_in_both_namespaces_only_when_asked():
    for setting, want in ((None, 0), (0, 2)):
        ip = FakeIp()
        with bsl.SlowLink(tag="t3", run=ip, slow_start_after_idle=setting):
            pass
        cmds = [c for c in ip.cmds if "tcp_slow_start_after_idle" in c]
        assert len(cmds) == want
        assert all(c.endswith("net.ipv4.tcp_slow_start_after_idle=0") for c in cmds)
        assert {c.split()[3] for c in cmds} == ({"mcct3a", "mcct3b"} if want else set())


class FakeSysctl(FakeIp):
    """FakeIp whose host answers `sysctl -n <allowed list>` with `allowed`."""

    def __init__(self, allowed):
        super().__init__()
        self.allowed = allowed

    def __call__(self, cmd):
        done = super().__call__(cmd)
        if cmd[:2] == ["sysctl", "-n"]:
            return subprocess.CompletedProcess(cmd, 0, self.allowed + "\n", "")
        return done


def test_congestion_control_is_allowed_set_per_namespace_and_the_host_list_restored():
    ip = FakeSysctl("reno bbr")
    with bsl.SlowLink(tag="t7", run=ip, congestion_control="cubic"):
        pass
    key = "net.ipv4.tcp_allowed_congestion_control"
    host = [c for c in ip.cmds if c.startswith("sysctl -qw")]
    # allowed first (a namespace may only choose what the host allows), restored after the
    # namespaces are gone
    assert host == [f"sysctl -qw {key}=reno bbr cubic", f"sysctl -qw {key}=reno bbr"]
    assert ip.cmds.index(host[1]) > max(i for i, c in enumerate(ip.cmds) if "netns del" in c)
    per_ns = [c for c in ip.cmds if c.endswith("net.ipv4.tcp_congestion_control=cubic")]
    assert {c.split()[3] for c in per_ns} == {"mcct7a", "mcct7b"}
    # already allowed: the host's list is left alone; not asked: nothing is set at all
    ip = FakeSysctl("reno bbr cubic")
    with bsl.SlowLink(tag="t8", run=ip, congestion_control="cubic"):
        pass
    assert not [c for c in ip.cmds if c.startswith("sysctl -qw")]
    ip = FakeIp()
    with bsl.SlowLink(tag="t9", run=ip):
        pass
    assert not [c for c in ip.cmds if "congestion_control" in c]


def test_an_unknown_congestion_control_is_refused_naming_the_flag():
    bsl.check_congestion_control(None, "reno cubic")
    bsl.check_congestion_control("cubic", "reno cubic")
    with pytest.raises(ValueError, match=r"--tcp-congestion-control 'vegas'.*reno, cubic"):
        bsl.check_congestion_control("vegas", "reno cubic")


def test_drops_reads_each_ends_tbf_counter_and_zero_unshaped():
    out = {"mcct4a": " qdisc tbf 8001: root refcnt 2 rate 5Mbit burst 128Kb lat 840.0ms\n"
                     " Sent 9051846 bytes 6121 pkt (dropped 43, overlimits 9921 requeues 0)",
           "mcct4b": " qdisc noqueue 0: root refcnt 2\n Sent 0 bytes 0 pkt (dropped 0, "
                     "overlimits 0 requeues 0)"}
    link = bsl.SlowLink(tag="t4", run=lambda cmd: subprocess.CompletedProcess(
        cmd, 0, out[cmd[3]], ""))
    assert link.drops() == [43, 0]
    assert bsl.SlowLink(tag="t5", run=FakeIp()).drops() == [0, 0]   # no tc output at all


def test_tbf_queue_ms_reaches_the_qdisc():
    ip = FakeIp()
    with bsl.SlowLink(tag="t6", run=ip, queue_ms=50) as link:
        link.set_rate("5mbit")
    want = bsl.tbf_limit("5mbit", 50)
    assert want == 5_000_000 // 8 * 50 // 1000 + 128 * 1024
    assert sum(f"tbf rate 5mbit burst 128kb limit {want}" in c for c in ip.cmds) == 2


def test_without_root_one_clear_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        bsl.require_root()
    assert "needs root" in str(e.value) and "\n" not in str(e.value)


def test_replot_tabulates_saved_results(tmp_path):
    def rec(config, rate, overlap, ms):
        return {"config": config, "rate": rate, "overlap": overlap, "placement": "pp",
                "ms_per_iter": ms, "ms_min": ms - 1, "wire_bytes": 1.01e6,
                "logged_bytes": 1e6, "final_loss": 7.5, "wait_ms": {"pp-fwd": 3.0}}
    recs = [rec("uncompressed", "none", False, 1000), rec("uncompressed", "20mbit", False, 4000),
            rec("uncompressed", "20mbit", True, 3000), rec("all-pipeline", "20mbit", True, 800),
            rec("all-pipeline", "none", True, 1000)]
    (tmp_path / "slow_link.json").write_text(json.dumps(recs))
    assert bsl.main(["--replot", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "slow_link.md").read_text()
    row = [l for l in table.splitlines() if "| 20mbit | all-pipeline |" in l][0]
    # 4000 / 800 against uncompressed synchronous; 800 / 1000 against its own unthrottled run
    assert "| 5.00x | 0.80x |" in row and "| 1.0100 |" in row
    assert "| 20mbit | uncompressed | 4000 (3999) | 3000 (2999) | 1.33x |" in table
    assert (tmp_path / "slow_link.png").stat().st_size > 0


def test_a_periodic_dp_mode_is_measured_per_sync_net_of_the_quiet_traffic(tmp_path):
    """Syncs at 4 and 8 (5 KB logged each, 5.05 KB on the wire, 50 B of it draining into the
    next iteration); about 2 KB per iteration besides, whose scatter must not add up."""
    quiet, payload = 2000.0, 5050.0
    lines, counters, total = [], {}, 0.0
    for i in range(1, 11):
        synced = i in (4, 8)
        total += quiet + (i % 2) * 10 + (payload - 50 if synced else 0.0) + (50 if i in (5, 9) else 0)
        counters[i] = {"tx_bytes": total, "tx_packets": 0, "rx_bytes": 0, "rx_packets": 0}
        lines.append({"iteration": i, "ms": 100.0 + (300.0 if synced else 0.0), "loss": 1.0,
                      "bytes": {"dp": 5000.0} if synced else {}, "wait_ms": {}})
    r = bsl.summarise(lines, counters, skip=1, crossing=("dp",))
    assert r["syncs"] == 2 and r["dp_logged_per_sync"] == 5000.0
    # quiet iterations 2, 3, 6, 7: 2000 or 2010, median 2005; syncs' pairs 4+5 and 8+9 carry 10
    assert r["dp_wire_per_sync"] == pytest.approx(payload) and r["quiet_wire_per_iter"] == 2005
    assert r["ms_per_iter"] == 100.0 and r["ms_mean"] == pytest.approx(100 + 600 / 8)
    # a mode that sends every step has no quiet iterations to subtract: not periodic
    every = [dict(l, bytes={"dp": 5000.0}) for l in lines]
    assert "syncs" not in bsl.summarise(every, counters, skip=1, crossing=("dp",))
    base = dict(r, config="uncompressed-dp", rate="none", overlap=False, placement="dp")
    base.update(syncs=0, ms_mean=160.0)
    rec = dict(r, config="sparseloco-dp", rate="20mbit", overlap=True, placement="dp")
    text = bsl.periodic_table([base, rec])
    assert "| 20mbit | sparseloco-dp | overlap | 175 | 1.094x | 2 | 4.9 | 4.9 | 1.0100 |" in text


def test_virtual_pipeline_adds_interleaved_twins():
    names = bsl.with_virtual(["uncompressed", "sc16", "all-pipeline"], 2)
    assert names == ["uncompressed", "uncompressed-vp2", "sc16", "all-pipeline",
                     "all-pipeline-vp2"]
    placement, flags = bsl.CONFIGS["all-pipeline-vp2"]
    assert placement == "pp" and flags[-2:] == ["--virtual-pipeline-model-parallel-size", "2"]
    assert flags[:-2] == bsl.CONFIGS["all-pipeline"][1]
    from megatron.training.flags.arguments import parse_args
    argv = bsl.MODEL + ["--pipeline-model-parallel-size", "2", "--global-batch-size", "32"]
    assert parse_args(argv + flags, world_size=2).vp == 2   # the bench's model accepts it
