"""Measured codec speeds: the file format the planner's GPU table is read from.

A codec-speeds file is one JSON object. The planner reads "codec_throughput_gbs"; the other
keys say where the numbers come from:

    {"device": ..., "torch": ...,
     "measured": {"command": ..., "date": ...},           what took the timings
     "statistic": "...",                                  how rows became one number
     "codec_throughput_gbs": {"fixpoint": ..., ...},      the planner's table (GB/s)
     "rows": {"fixpoint": [{"label", "shape", "dtype", "gbs"}, ...], ...},
     "derived": {"powersgd": "lowrank: ...", ...}}        codecs with no row of their own

Throughput = uncompressed bytes / (encode + decode time), as step_time.py charges codec time;
one codec's number is the median of its rows, and a codec without rows takes a related one's
(DERIVED). bench/bench_gpu.py --json writes such a file; codec_speeds_h200.json is the default.
"""
import json
import math
import os
import statistics
from typing import Dict, Iterable, List, Mapping

DEFAULT_GPU_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "codec_speeds_h200.json")
COPY = "device copy"
# (planner codec, source, why), applied in order where the codec has no row: the source is a
# codec whose rows (or derived number) stand in for it, or COPY (the rows' measured copies)
DERIVED = (
    ("rsvd", "lowrank", "CB by a randomized SVD: the same matmul pairs and error buffer as "
                        "PowerSGD's CB per message"),
    ("powersgd", "lowrank", "data-parallel PowerSGD: CB's power step per matrix"),
    ("int8", "fixpoint", "DiLoCo's 8-bit bucket quantiser: the fixpoint quantiser on a flat "
                         "bucket"),
    ("fixpoint-b", "int8", "DiLoCo's b-bit bucket quantiser: int8's codec at other bits"),
    ("sparseloco", "cocktail", "a top-k selection and a b-bit quantiser, as CocktailSGD's"),
    ("fp16", COPY, "a cast: fp32 -> fp16 -> fp32 reads and writes 12 bytes a value, 1.5 "
                   "times what a copy of the fp32 value moves (fp32 rows' copies)"),
)
STATISTIC = ("median over a codec's rows of uncompressed bytes / (encode + decode time); "
             "rows: every shape and dtype measured")


class CodecSpeedsError(ValueError):
    """An unreadable or malformed codec-speeds file; the message names the file and the fix."""


def row_gbs(raw_bytes: float, encode_ms: float, decode_ms: float) -> float:
    """GB/s of uncompressed input for one encode and one decode."""
    return raw_bytes / ((encode_ms + decode_ms) * 1e-3) / 1e9


def _cast_gbs(row: Mapping) -> float:
    """fp16's rate from an fp32 row's copy (see DERIVED)."""
    return row["input_bytes"] / (1.5 * row["copy_ms"] * 1e-3) / 1e9


def summarize(rows: Iterable[Mapping]) -> Dict:
    """The file's "statistic", "codec_throughput_gbs", "rows" and "derived" from measured rows
    (mappings with codec, label, shape, dtype, raw_bytes, input_bytes, encode_ms, decode_ms,
    copy_ms); rows with a NaN time are left out."""
    rows = [r for r in rows if not (math.isnan(r["encode_ms"]) or math.isnan(r["decode_ms"]))]
    per: Dict[str, List[Dict]] = {}
    for r in rows:
        per.setdefault(r["codec"], []).append(
            {"label": r["label"], "shape": str(tuple(r["shape"])), "dtype": r["dtype"],
             "gbs": row_gbs(r["raw_bytes"], r["encode_ms"], r["decode_ms"])})
    table = {c: statistics.median(x["gbs"] for x in v) for c, v in per.items()}
    derived = {}
    for codec, source, why in DERIVED:
        if codec in table:
            continue
        if source == COPY:
            fp32 = [_cast_gbs(r) for r in rows if r["dtype"] == "float32"]
            if not fp32:
                continue
            table[codec] = statistics.median(fp32)
        elif source in table:
            table[codec] = table[source]
        else:
            continue
        derived[codec] = f"{source}: {why}"
    return {"statistic": STATISTIC, "codec_throughput_gbs": dict(sorted(table.items())),
            "rows": per, "derived": derived}


def parse(doc, where: str) -> Dict[str, float]:
    """{codec: GB/s} of a loaded codec-speeds document (CodecSpeedsError naming `where`)."""
    fix = ("give a codec-speeds JSON: bench/bench_gpu.py --json's output or "
           "megatron/cc/plan/codec_speeds_h200.json")
    table = doc.get("codec_throughput_gbs") if isinstance(doc, dict) else None
    if not isinstance(table, dict) or not table:
        raise CodecSpeedsError(f"{where}: no \"codec_throughput_gbs\" mapping in it; {fix}")
    out = {}
    for name, v in table.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                or math.isinf(v):
            raise CodecSpeedsError(f"{where}: codec_throughput_gbs.{name} is {v!r}, expected "
                                   f"a positive number of GB/s; {fix}")
        out[str(name)] = float(v)
    return out


def load(path: str) -> Dict[str, float]:
    """{codec: GB/s} of a codec-speeds file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CodecSpeedsError(f"{path}: cannot read it as JSON ({e}); give a codec-speeds "
                               f"JSON (bench/bench_gpu.py --json's output)") from None
    return parse(doc, path)
