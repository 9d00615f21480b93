"""Print the ASPLOS23 experiment logs side by side: python summarize.py OUT_DIR scheme..."""
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from runlog import parse_log  # noqa: E402

_PEAK = re.compile(r"peak memory \(MB\): max over ranks ([\d.]+)")


def main():
    out, schemes = sys.argv[1], sys.argv[2:]
    rows = []
    for s in schemes:
        path = os.path.join(out, f"{s}.log")
        if not os.path.exists(path):
            continue
        text = open(path).read()
        r = parse_log(s, text)
        peak = _PEAK.search(text)
        rows.append((s, r, float(peak.group(1)) if peak else float("nan")))
    print(f"{'scheme':12s}{'final val loss':>16s}{'val PPL':>10s}{'ms/iter':>10s}"
          f"{'pp-bwd x':>10s}{'dp x':>8s}{'emb MB/it':>11s}{'peak MB':>9s}")
    for s, r, peak in rows:
        v = r.final_valid if r.final_valid is not None else float("nan")
        print(f"{s:12s}{v:16.4f}{math.exp(min(v, 20)):10.1f}{r.steady_ms:10.1f}"
              f"{r.ratio.get('pp-bwd', 1.0):10.1f}{r.ratio.get('dp', 1.0):8.1f}"
              f"{r.bytes_per_iter.get('emb', 0) / 1e6:11.2f}{peak:9.1f}")


if __name__ == "__main__":
    main()
