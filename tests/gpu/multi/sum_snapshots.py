"""Sums per-rank snapshot JSON files into one report."""
import json
import sys

totals = {}
for path in sys.argv[1:]:
    with open(path) as f:
        snap = json.load(f)
    for key in ("physical_bytes", "physical_peak_bytes", "mapped_peak_bytes"):
        totals[key] = totals.get(key, 0) + snap["totals"][key]
    for key in ("hits", "misses"):
        totals["pool_" + key] = totals.get("pool_" + key, 0) + snap["pool"][key]
    print(f"{path}: device {snap['device']} peak {snap['totals']['physical_peak_bytes'] / 2**30:.2f} GiB")
for key, value in totals.items():
    print(f"all ranks {key}: {value}")
