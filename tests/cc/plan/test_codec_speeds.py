"""megatron/cc/plan/codec_speeds.py: rows -> one throughput per planner codec (median, the
derived codecs named), the file format's errors, and the GPU table step_time.py reads."""
import json
import math

import pytest

from megatron.cc.plan import codec_speeds
from megatron.cc.plan.step_time import CODEC_THROUGHPUT_GBS, codec_seconds


def _row(codec, enc, dec, dtype="float32", raw=1e9, copy=1.0, label=None):
    return {"codec": codec, "label": label or codec, "shape": (1, 2, 3), "dtype": dtype,
            "raw_bytes": raw, "input_bytes": raw, "encode_ms": enc, "decode_ms": dec,
            "copy_ms": copy}


def test_median_of_each_codecs_rows_and_the_derived_ones_named():
    rows = [_row("fixpoint", 10, 10), _row("fixpoint", 40, 60), _row("fixpoint", 1, 3),
            _row("lowrank", 500, 500), _row("cocktail", math.nan, 1.0)]
    doc = codec_speeds.summarize(rows)
    t = doc["codec_throughput_gbs"]
    assert t["fixpoint"] == pytest.approx(1e9 / 20e-3 / 1e9)        # median of 250, 50, 10
    assert t["lowrank"] == pytest.approx(1.0)
    assert "cocktail" not in t and "sparseloco" not in t           # no (finite) row: none
    assert t["rsvd"] == t["powersgd"] == t["lowrank"]
    assert t["int8"] == t["fixpoint-b"] == t["fixpoint"]           # a chain: int8, then b
    # fp16, a cast: 12 bytes a value where an fp32 copy moves 8
    assert t["fp16"] == pytest.approx(1e9 / 1.5e-3 / 1e9)
    assert set(doc["derived"]) == {"rsvd", "powersgd", "int8", "fixpoint-b", "fp16"}
    assert doc["derived"]["fixpoint-b"].startswith("int8: ")
    assert [r["gbs"] for r in doc["rows"]["fixpoint"]] == pytest.approx([50, 10, 250])
    measured = codec_speeds.summarize(rows + [_row("int8", 5, 5), _row("fp16", 1, 1)])
    assert "int8" not in measured["derived"] and "fp16" not in measured["derived"]
    assert measured["codec_throughput_gbs"]["fixpoint-b"] == pytest.approx(100)


@pytest.mark.parametrize("text,fragment", [
    ("{", "cannot read it as JSON"),
    ("[]", 'no "codec_throughput_gbs" mapping'),
    ('{"codec_throughput_gbs": {}}', 'no "codec_throughput_gbs" mapping'),
    ('{"codec_throughput_gbs": {"fixpoint": 0}}', "codec_throughput_gbs.fixpoint is 0"),
    ('{"codec_throughput_gbs": {"fixpoint": true}}', "codec_throughput_gbs.fixpoint is True"),
    ('{"codec_throughput_gbs": {"tah": "fast"}}', "codec_throughput_gbs.tah is 'fast'"),
])
def test_a_bad_file_is_named_with_the_fix(tmp_path, text, fragment):
    path = tmp_path / "speeds.json"
    path.write_text(text)
    with pytest.raises(codec_speeds.CodecSpeedsError) as e:
        codec_speeds.load(str(path))
    assert str(e.value).startswith(str(path)) and fragment in str(e.value)
    assert "bench_gpu.py --json" in str(e.value)
    with pytest.raises(codec_speeds.CodecSpeedsError, match="cannot read"):
        codec_speeds.load(str(tmp_path / "missing.json"))


def test_the_gpu_table_is_the_h200_measurement():
    doc = json.loads(open(codec_speeds.DEFAULT_GPU_FILE).read())
    gpu = CODEC_THROUGHPUT_GBS["gpu"]
    assert gpu == codec_speeds.parse(doc, "h200")
    assert set(CODEC_THROUGHPUT_GBS["cpu"]) <= set(gpu)       # every planner codec
    assert doc["measured"]["date"] and doc["measured"]["command"]
    assert doc["device"] == "NVIDIA H200"
    # a codec the H200 run timed has rows; the others say where they come from
    for name in gpu:
        assert (name in doc["rows"]) != (name in doc["derived"]), name
    # fixpoint: encode ~2-3 ms + decode ~0.04 ms for 31-403 MB, not the 100 GB/s once assumed
    assert 10 < gpu["fixpoint"] < 40


def test_a_clusters_own_throughputs_still_override_single_codecs():
    from megatron.cc.plan.links import cluster_from_dict
    cl = cluster_from_dict({"nodes": 1, "gpus_per_node": 1, "tflops_per_gpu": 1,
                            "links": {"intra_node": {"bandwidth_gbps": 1, "latency_us": 0}}})
    raw = 1e9
    assert codec_seconds(cl, "tah", raw) == pytest.approx(1 / CODEC_THROUGHPUT_GBS["gpu"]["tah"])
    cl.codec_throughput_gbs = {"tah": 4.0}
    assert codec_seconds(cl, "tah", raw) == pytest.approx(0.25)
