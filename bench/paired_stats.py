#!/usr/bin/env python3
"""Paired rounds of the GPU benchmarks: each round runs every mode side by side, so a mode's time
over native's in the same round cancels what the round shares. This module gives those ratios,
their median and range, and the geometric mean with its 95% interval (Student's t on the
logarithms), which says whether the rounds can tell a mode from native at all.

Run as a script, it pools the rounds of several bench_process.py JSON files (each round paired
with native's round in the same file; a file may also hold a list of such results), per device,
catalog and mode:

  paired_stats.py A.json B.json ... [--key warmup|cpu]
"""
import argparse
import json
import math
import statistics
import sys

KEYS = {"warmup": lambda x: x.get("warmup_s"), "cpu": lambda x: x.get("cpu_s")}  # None where not measured
# Two-sided 95% quantiles of Student's t where the expansion below is too coarse.
T975_SMALL_DF = {1: 12.706, 2: 4.303, 3: 3.182}


def round_ratios(r, native, key=KEYS["warmup"]):
    """This mode's time over native's in the same round, for every round both ran and measured."""
    if not native or "by_round" not in r or "by_round" not in native:
        return []
    pairs = ((key(x), key(native["by_round"][k])) for k, x in r["by_round"].items() if k in native["by_round"])
    return [mine / theirs for mine, theirs in pairs if mine is not None and theirs]


def paired(r, native, key=KEYS["warmup"]):
    """The median of round_ratios, or None."""
    got = round_ratios(r, native, key)
    return statistics.median(got) if got else None


def paired_text(r, native, key=KEYS["warmup"]):
    """The paired ratio and, over several rounds, the range of the rounds' ratios: a range
    across 1.00x says the rounds' spread is larger than the difference."""
    got = round_ratios(r, native, key)
    if not got:
        return "-"
    spread = f" ({min(got):.2f}-{max(got):.2f})" if min(got) < max(got) else ""
    return f"{statistics.median(got):.2f}x{spread}"


def t975(df):
    """Student's t quantile for a two-sided 95% interval with df degrees of freedom (the
    Cornish-Fisher expansion from the normal quantile; within 0.3% of the tables from df 4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df in T975_SMALL_DF:
        return T975_SMALL_DF[df]
    z = statistics.NormalDist().inv_cdf(0.975)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def interval(ratios):
    """(geometric mean, low, high) of the ratios with a 95% interval, or None below 3 ratios."""
    if len(ratios) < 3:
        return None
    if min(ratios) <= 0:
        raise ValueError(f"ratios must be positive, got {min(ratios)}")
    logs = [math.log(x) for x in ratios]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(iv):
    """What the interval allows one to say against 1.00x."""
    if iv is None:
        return "too few rounds"
    _, low, high = iv
    return "faster" if high < 1 else "slower" if low > 1 else "not told apart"


def interval_text(ratios):
    iv = interval(ratios)
    if iv is None:
        return f"{len(ratios)} rounds, too few for an interval"
    return f"geometric mean {iv[0]:.3f}x, 95% interval {iv[1]:.3f}-{iv[2]:.3f}x over {len(ratios)} rounds: {verdict(iv)}"


def pool(documents, key=KEYS["warmup"]):
    """{(device, catalog, mode): [ratio, ...]} over bench_process.py results, each round paired
    with native's round of the same document; modes without native in their document are left out."""
    pooled = {}
    for doc in documents:
        for catalog, modes in doc.get("runs", {}).items():
            native = modes.get("native")
            for mode, r in modes.items():
                if mode == "native" or native is None:
                    continue
                got = round_ratios(r, native, key)
                if got:
                    pooled.setdefault((r.get("device", "?"), catalog, mode), []).extend(got)
    return pooled


def load(path):
    """The results in one file: bench_process.py's output, or a list of such (an archive of calls)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not a readable benchmark result ({e})")
    docs = doc if isinstance(doc, list) else [doc]
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or not isinstance(d.get("runs"), dict):
            where = f" (item {i})" if isinstance(doc, list) else ""
            raise SystemExit(f"{path}{where}: no 'runs' object (is it bench_process.py's output?)")
    return docs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="bench_process.py JSON files")
    parser.add_argument("--key", choices=sorted(KEYS), default="warmup", help="the warmup's wall time or CPU time")
    args = parser.parse_args(argv)
    documents = [d for p in args.results for d in load(p)]
    pooled = pool(documents, KEYS[args.key])
    if not pooled:
        raise SystemExit("no mode ran beside native in the same rounds in these files")
    print(f"{args.key} time over native's in the same round, pooled over {len(documents)} result(s) "
          f"in {len(args.results)} file(s)\n")
    print("| device | catalog | mode | rounds | median (range) | geometric mean | 95% interval | verdict |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for (device, catalog, mode), got in sorted(pooled.items()):
        iv = interval(got)
        mean, span = (f"{iv[0]:.3f}x", f"{iv[1]:.3f}-{iv[2]:.3f}x") if iv else ("-", "-")
        print(f"| {device} | {catalog} | {mode} | {len(got)} | {statistics.median(got):.2f}x "
              f"({min(got):.2f}-{max(got):.2f}) | {mean} | {span} | {verdict(iv)} |")


if __name__ == "__main__":
    sys.exit(main())
