"""Cluster YAML: a valid file loads with ranks placed megatron-core's way; every mistake is
refused with the key named and a fix."""
import pytest

from megatron.cc.plan.links import ClusterConfigError, cluster_from_dict, load_cluster

GOOD = {"nodes": 4, "gpus_per_node": 2, "tflops_per_gpu": 100, "datacentres": 2,
        "links": {"intra_node": {"bandwidth_gbps": 1000, "latency_us": 2},
                  "inter_node": {"bandwidth_gbps": 100, "latency_us": 5},
                  "inter_datacentre": {"bandwidth_gbps": 1, "latency_us": 10000}}}


def test_valid_yaml_and_levels(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nodes: 4\ngpus_per_node: 2\ndatacentres: [[0, 1], [2, 3]]\n"
                    "gpu_memory_gb: 80\nlinks:\n"
                    "  intra_node: {bandwidth_gbps: 1000, latency_us: 2}\n"
                    "  inter_node: {bandwidth_gbps: 100, latency_us: 5}\n"
                    "  inter_datacentre: {bandwidth_gbps: 1, latency_us: 10000}\n")
    c = load_cluster(str(path))
    assert c.world_size == 8 and c.gpu_memory_gb == 80 and c.device == "gpu"
    assert [c.level(0, r) for r in range(8)] == ["intra_node"] * 2 + ["inter_node"] * 2 + \
        ["inter_datacentre"] * 4
    assert c.group_level([0, 1]) == "intra_node" and c.group_level([0, 2, 6]) == \
        "inter_datacentre"
    assert c.links["inter_datacentre"].bytes_per_s == 1e9 / 8
    assert cluster_from_dict(GOOD).datacentres == [[0, 1], [2, 3]]


def _with(**changes):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in GOOD.items()}
    raw["links"] = {k: dict(v) for k, v in GOOD["links"].items()}
    for key, value in changes.items():
        node = raw
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return raw


@pytest.mark.parametrize("changes,fragment", [
    ({"nodes": KeyError}, "nodes: missing; add nodes"),
    ({"nodes": 0}, "nodes: expected a positive integer"),
    ({"gpus_per_node": "eight"}, "gpus_per_node: expected a positive integer"),
    ({"gpu_per_node": 8}, "gpu_per_node: unknown key; use one of nodes, gpus_per_node"),
    ({"links.inter_datacentre": KeyError}, "links.inter_datacentre: missing, but the cluster"),
    ({"links.inter_node": KeyError}, "links.inter_node: missing"),
    ({"links.wan": {"bandwidth_gbps": 1, "latency_us": 1}}, "links.wan: unknown link level"),
    ({"links.inter_node.bandwidth_gbps": -3}, "links.inter_node.bandwidth_gbps: expected a "
                                               "positive number (Gbit/s)"),
    ({"links.inter_node.latency_us": KeyError}, "links.inter_node: missing latency_us"),
    ({"links.inter_node.latency": 5}, "links.inter_node.latency: unknown key; use "
                                      "bandwidth_gbps and latency_us (optionally burst_kb)"),
    ({"links.intra_node.latency_us": -1}, "links.intra_node.latency_us: expected a number >= 0"),
    ({"links.inter_node.burst_kb": "128kb"}, "links.inter_node.burst_kb: expected a number >= 0 "
                                             "(KiB), got '128kb'; write e.g. burst_kb: 128"),
    ({"datacentres": 3}, "datacentres: 3 datacentres do not split 4 nodes evenly"),
    ({"datacentres": [[0, 1], [1, 2, 3]]}, "datacentres: the lists hold nodes [0, 1, 1, 2, 3]"),
    ({"device": "tpu"}, "device: expected gpu or cpu"),
    ({"codec_throughput_gbs": {"fixpoint": 0}}, "codec_throughput_gbs.fixpoint: expected a "
                                                "positive number"),
])
def test_bad_yaml_names_the_key_and_the_fix(changes, fragment):
    with pytest.raises(ClusterConfigError) as e:
        cluster_from_dict(_with(**changes))
    assert fragment in str(e.value)
    assert ";" in str(e.value)   # problem; fix


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ClusterConfigError, match="cannot read it"):
        load_cluster(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [1,\n")
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        load_cluster(str(bad))
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ClusterConfigError, match=r"list.yaml: cluster: expected a mapping"):
        load_cluster(str(top))
