"""A cluster as the cost model sees it: where every rank sits and what its links carry.

YAML (tools/plan_compression.py --cluster):

    nodes: 8                 # machines
    gpus_per_node: 8
    tflops_per_gpu: 150      # achieved dense TFLOP/s per GPU (the 6 N tokens rule's rate)
    device: gpu              # gpu | cpu: which default codec throughput table (step_time.py)
    datacentres: 2           # an int (nodes split evenly, in order) or lists of node indices,
                             # e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]; default 1
    links:                   # Gbit/s and microseconds, one direction
      intra_node:       {bandwidth_gbps: 2400, latency_us: 2}      # per GPU
      inter_node:       {bandwidth_gbps: 200, latency_us: 5}       # per GPU
      inter_datacentre: {bandwidth_gbps: 10, latency_us: 20000}    # the whole interconnect,
                                                                   # shared by every flow on it
      # optional burst_kb: a token-bucket shaper's burst (tc tbf's `burst`, KiB): bytes that
      # pass at line rate once the link has been idle long enough to refill the bucket
    codec_throughput_gbs: {fixpoint: 80}   # optional: measured GB/s overriding the defaults
    gpu_memory_gb: 80        # optional: the planner drops layouts whose weights, gradients and
                             # Adam states (18 bytes per parameter) do not fit one GPU

Ranks are placed as megatron-core places them (tensor-parallel fastest, then data-parallel,
then pipeline: rank = t + tp (d + dp p); Layout.rank_order tp-pp-dp, a what-if the driver
does not launch, swaps the last two) on nodes filled in order. A pair of ranks talks over
the slowest level they span. `inter_node` is needed when a datacentre has several nodes and
`inter_datacentre` when there are several datacentres; every error names the key and the fix.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

LEVELS = ("intra_node", "inter_node", "inter_datacentre")
TOP_KEYS = ("nodes", "gpus_per_node", "tflops_per_gpu", "device", "datacentres", "links",
            "codec_throughput_gbs", "gpu_memory_gb")
LINK_KEYS = ("bandwidth_gbps", "latency_us")
OPTIONAL_LINK_KEYS = ("burst_kb",)


class ClusterConfigError(ValueError):
    """A cluster description that cannot be used; the message names the key and the fix."""


@dataclass
class LinkSpec:
    bandwidth_gbps: float
    latency_us: float
    burst_kb: float = 0.0
    """Token bucket of a shaped link (KiB, each direction): refilled at the bandwidth while
    the link idles, it lets that many bytes through at line rate (taken as instantaneous)."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6

    @property
    def burst_bytes(self) -> float:
        return self.burst_kb * 1024


@dataclass
class Cluster:
    nodes: int
    gpus_per_node: int
    links: Dict[str, LinkSpec]
    tflops_per_gpu: float = 100.0
    device: str = "gpu"
    datacentres: List[List[int]] = field(default_factory=list)
    """Node indices per datacentre; empty: one datacentre holding every node."""
    codec_throughput_gbs: Dict[str, float] = field(default_factory=dict)
    gpu_memory_gb: Optional[float] = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def datacentre_of(self, node: int) -> int:
        for i, members in enumerate(self.datacentres):
            if node in members:
                return i
        return 0

    def level(self, a: int, b: int) -> str:
        """The slowest level between global ranks a and b."""
        na, nb = a // self.gpus_per_node, b // self.gpus_per_node
        if self.datacentre_of(na) != self.datacentre_of(nb):
            return "inter_datacentre"
        return "intra_node" if na == nb else "inter_node"

    def group_level(self, ranks: Sequence[int]) -> str:
        """The slowest level any two ranks of a group span."""
        levels = {self.level(ranks[0], r) for r in ranks[1:]} | {"intra_node"}
        return max(levels, key=LEVELS.index)

    def rank_datacentre(self, rank: int) -> int:
        return self.datacentre_of(rank // self.gpus_per_node)

    def datacentres_spanned(self, ranks: Sequence[int]) -> int:
        return len({self.rank_datacentre(r) for r in ranks})

    def with_link(self, level: str, bandwidth_gbps: float) -> "Cluster":
        """A copy with one level's bandwidth changed (the plot's sweep)."""
        links = dict(self.links)
        links[level] = LinkSpec(bandwidth_gbps, links[level].latency_us, links[level].burst_kb)
        return Cluster(self.nodes, self.gpus_per_node, links, self.tflops_per_gpu, self.device,
                       self.datacentres, self.codec_throughput_gbs, self.gpu_memory_gb)


def _fail(where: str, problem: str, fix: str):
    raise ClusterConfigError(f"{where}: {problem}; {fix}")


def _positive(value, where: str, unit: str, integer: bool = False):
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        _fail(where, f"expected {kind} ({unit}), got {value!r}", f"write e.g. {where}: "
              f"{8 if integer else 100}")
    return value


def _links(raw, where: str) -> Dict[str, LinkSpec]:
    if not isinstance(raw, dict):
        _fail(where, f"expected a mapping of levels, got {raw!r}",
              f"give one entry per level ({', '.join(LEVELS)}) with {' and '.join(LINK_KEYS)}")
    out = {}
    for level, spec in raw.items():
        if level not in LEVELS:
            _fail(f"{where}.{level}", "unknown link level", f"use one of {', '.join(LEVELS)}")
        if not isinstance(spec, dict):
            _fail(f"{where}.{level}", f"expected a mapping, got {spec!r}",
                  "write {bandwidth_gbps: 100, latency_us: 5}")
        for key in spec:
            if key not in LINK_KEYS + OPTIONAL_LINK_KEYS:
                _fail(f"{where}.{level}.{key}", "unknown key",
                      f"use {' and '.join(LINK_KEYS)} (optionally {OPTIONAL_LINK_KEYS[0]})")
        for key in LINK_KEYS:
            if key not in spec:
                _fail(f"{where}.{level}", f"missing {key}", f"add {key}: <number>")
        lat = spec["latency_us"]
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or lat < 0:
            _fail(f"{where}.{level}.latency_us", f"expected a number >= 0 (microseconds), got "
                  f"{lat!r}", "write e.g. latency_us: 5")
        burst = spec.get("burst_kb", 0)
        if isinstance(burst, bool) or not isinstance(burst, (int, float)) or burst < 0:
            _fail(f"{where}.{level}.burst_kb", f"expected a number >= 0 (KiB), got {burst!r}",
                  "write e.g. burst_kb: 128, or leave it out (no shaper burst)")
        out[level] = LinkSpec(float(_positive(spec["bandwidth_gbps"],
                                              f"{where}.{level}.bandwidth_gbps", "Gbit/s")),
                              float(lat), float(burst))
    return out


def _datacentres(raw, nodes: int) -> List[List[int]]:
    if raw is None or raw == 1:
        return [list(range(nodes))]
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1 or nodes % raw:
            _fail("datacentres", f"{raw} datacentres do not split {nodes} nodes evenly",
                  "give a divisor of nodes, or list the node indices of each datacentre")
        per = nodes // raw
        return [list(range(i * per, (i + 1) * per)) for i in range(raw)]
    if not isinstance(raw, list) or not all(isinstance(d, list) for d in raw):
        _fail("datacentres", f"expected an int or a list of node-index lists, got {raw!r}",
              "write e.g. datacentres: [[0, 1], [2, 3]]")
    seen = sorted(n for d in raw for n in d)
    if seen != list(range(nodes)):
        _fail("datacentres", f"the lists hold nodes {seen}, not each of 0..{nodes - 1} once",
              "list every node index exactly once")
    return [list(d) for d in raw]


def cluster_from_dict(raw) -> Cluster:
    """Validate a parsed YAML mapping into a Cluster (ClusterConfigError naming the key)."""
    if not isinstance(raw, dict):
        _fail("cluster", f"expected a mapping at the top level, got {type(raw).__name__}",
              f"write the keys {', '.join(TOP_KEYS[:3])}, links, ...")
    for key in raw:
        if key not in TOP_KEYS:
            _fail(key, "unknown key", f"use one of {', '.join(TOP_KEYS)}")
    for key in ("nodes", "gpus_per_node", "links"):
        if key not in raw:
            _fail(key, "missing", f"add {key}: ... (see megatron/cc/plan/links.py)")
    nodes = _positive(raw["nodes"], "nodes", "machines", integer=True)
    gpn = _positive(raw["gpus_per_node"], "gpus_per_node", "GPUs", integer=True)
    links = _links(raw["links"], "links")
    dcs = _datacentres(raw.get("datacentres"), nodes)
    needed = ["intra_node"] if gpn > 1 else []
    if any(len(d) > 1 for d in dcs):
        needed.append("inter_node")
    if len(dcs) > 1:
        needed.append("inter_datacentre")
    for level in needed:
        if level not in links:
            _fail(f"links.{level}", "missing, but the cluster has links of this level",
                  f"add links.{level}: {{bandwidth_gbps: ..., latency_us: ...}}")
    device = raw.get("device", "gpu")
    if device not in ("gpu", "cpu"):
        _fail("device", f"expected gpu or cpu, got {device!r}", "write device: gpu")
    tput = raw.get("codec_throughput_gbs") or {}
    if not isinstance(tput, dict):
        _fail("codec_throughput_gbs", f"expected a mapping codec -> GB/s, got {tput!r}",
              "write e.g. codec_throughput_gbs: {fixpoint: 80}")
    for name, v in tput.items():
        _positive(v, f"codec_throughput_gbs.{name}", "GB/s")
    mem = raw.get("gpu_memory_gb")
    if mem is not None:
        mem = float(_positive(mem, "gpu_memory_gb", "GB"))
    return Cluster(nodes, gpn, links, float(_positive(raw.get("tflops_per_gpu", 100.0),
                                                      "tflops_per_gpu", "TFLOP/s")),
                   device, dcs, {k: float(v) for k, v in tput.items()}, mem)


def load_cluster(path: str) -> Cluster:
    import yaml
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ClusterConfigError(f"--cluster {path}: cannot read it ({e.strerror}); give the "
                                 f"path of a cluster YAML") from None
    except yaml.YAMLError as e:
        raise ClusterConfigError(f"--cluster {path}: not valid YAML ({e}); fix the syntax") \
            from None
    try:
        return cluster_from_dict(raw)
    except ClusterConfigError as e:
        raise ClusterConfigError(f"{path}: {e}") from None


RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")


def placement(tp: int, dp: int, pp: int, order: str = "tp-dp-pp"):
    """Global rank of (tensor rank t, data-parallel rank d, pipeline stage p), fastest first:
    tp-dp-pp is megatron-core's default (the driver's); tp-pp-dp keeps each replica's
    pipeline on consecutive nodes, so datacentres split between replicas (a what-if)."""
    if order == "tp-pp-dp":
        return lambda t, d, p: t + tp * (p + pp * d)
    if order != "tp-dp-pp":
        raise ValueError(f"rank order {order!r}: use one of {', '.join(RANK_ORDERS)}")
    return lambda t, d, p: t + tp * (d + dp * p)

