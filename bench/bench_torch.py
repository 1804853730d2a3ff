#!/usr/bin/env python3
"""GPU benchmark: the preparation workload of record_trace.py (a bf16 decoder, a 30-step
warmup catalog with eager forwards and CUDA graph captures) under four allocators, each in
its own process with the same seed:

  native        PyTorch's caching allocator
  expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  vmm-exact     vmmarena, retention on, exact reuse
  vmm-best-fit  vmmarena, retention on, best-fit reuse with stitching

Reports the peak memory held (torch.cuda.max_memory_reserved for the native runs, vmmarena's
physical_peak_bytes for the vmmarena runs, where every CUDA allocation of the workload goes to
vmmarena), the warmup's wall time, and whether the final logits equal the native run's (max
abs difference). Targets: under retention, vmmarena's peak <= min(native, expandable) + 5% and its
warmup time <= 1.1x native. Prints a markdown table and PASS/MISS lines; writes JSON to OUT.

Usage: bench_torch.py OUT.json [--library PATH] [--seed N]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_trace  # noqa: E402  (the workload)

GIB = float(1 << 30)
RUNS = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "vmm-exact": {"VMMARENA_RETAIN": "on", "VMMARENA_REUSE": "exact", "VMMARENA_STITCH": "on"},
    "vmm-best-fit": {"VMMARENA_RETAIN": "on", "VMMARENA_REUSE": "best-fit", "VMMARENA_STITCH": "on"},
}
PEAK_SLACK = 1.05
TIME_SLACK = 1.10


def worker(mode, seed, logits_path, result_path):
    import torch

    storage = None
    if mode.startswith("vmm"):
        storage = record_trace.import_vmmarena().Storage(0)
    warmup_s, logits, operands = record_trace.run_workload(torch, storage, seed)
    # For the vmmarena runs this counts the segments PyTorch held from vmmarena, not what
    # vmmarena retained beside them.
    torch_reserved_peak = torch.cuda.max_memory_reserved(0)
    result = {
        "mode": mode,
        "warmup_s": warmup_s,
        "torch_reserved_peak_bytes": torch_reserved_peak,
        "graph_operands": len(operands),
        "checksum": float(logits.double().sum()),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }
    if storage is not None:
        snap = storage.snapshot()
        result["peak_bytes"] = snap["totals"]["physical_peak_bytes"]
        result["pool"] = {k: snap["pool"][k] for k in ("hits", "misses", "fallbacks", "stitches")}
    else:
        result["peak_bytes"] = torch_reserved_peak
    import transformers

    result["transformers"] = transformers.__version__
    torch.save(logits, logits_path)
    Path(result_path).write_text(json.dumps(result))


def run_all(seed, library):
    import torch

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        logits = {}
        for mode, extra in RUNS.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith("VMMARENA_") and k != "PYTORCH_CUDA_ALLOC_CONF"}
            env.update(extra, VMMARENA_LIBRARY=library)
            logits_path, result_path = Path(tmp) / f"{mode}.pt", Path(tmp) / f"{mode}.json"
            print(f"== {mode}", flush=True)
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, __file__, "--worker", mode, "--seed", str(seed), str(logits_path), str(result_path)],
                env=env,
                check=True,
                timeout=record_trace.WORKER_TIMEOUT_S,
            )
            results[mode] = json.loads(result_path.read_text())
            results[mode]["process_s"] = time.perf_counter() - start
            logits[mode] = torch.load(logits_path)
        for mode in RUNS:
            results[mode]["max_abs_diff_vs_native"] = float((logits[mode] - logits["native"]).abs().max())
    return results


def report(results):
    native, expandable = results["native"], results["expandable"]
    print("\n| run | peak held | warmup | vs native time | logits checksum | max abs diff vs native |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['peak_bytes'] / GIB:.2f} GiB | {r['warmup_s']:.2f} s | "
            f"{r['warmup_s'] / native['warmup_s']:.2f}x | {r['checksum']:.6g} | {r['max_abs_diff_vs_native']:.3g} |"
        )
    first = next(iter(results.values()))
    print(f"\n{first['device']}, torch {first['torch']}, transformers {first['transformers']}")
    best_native = min(native["peak_bytes"], expandable["peak_bytes"])
    checks = []
    for mode in ("vmm-exact", "vmm-best-fit"):
        r = results[mode]
        peak_ok = r["peak_bytes"] <= best_native * PEAK_SLACK
        time_ok = r["warmup_s"] <= native["warmup_s"] * TIME_SLACK
        equal_ok = r["max_abs_diff_vs_native"] == 0.0
        checks.append({"run": mode, "peak": peak_ok, "time": time_ok, "logits_equal": equal_ok})
        print(
            f"{'PASS' if peak_ok else 'MISS'} {mode} peak {r['peak_bytes'] / GIB:.2f} GiB vs min(native, expandable) "
            f"{best_native / GIB:.2f} GiB (target <= +5%)"
        )
        print(
            f"{'PASS' if time_ok else 'MISS'} {mode} warmup {r['warmup_s']:.2f} s vs native {native['warmup_s']:.2f} s "
            f"(target <= 1.1x)"
        )
        print(
            f"{'PASS' if equal_ok else 'MISS'} {mode} final logits max abs diff {r['max_abs_diff_vs_native']:.3g} "
            "(target: equal to native)"
        )
    return checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the JSON results")
    parser.add_argument("--library", help="path of libvmmarena_torch.so")
    parser.add_argument("--seed", type=int, default=record_trace.DEFAULT_SEED)
    parser.add_argument("--worker", choices=sorted(RUNS), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        # The worker's positional arguments: LOGITS.pt RESULT.json (the first lands in `out`).
        worker(args.worker, args.seed, args.out, args.paths[0])
        return
    if not args.out or args.paths:
        parser.error("one output path is required")
    results = run_all(args.seed, record_trace.find_library(args.library))
    checks = report(results)
    Path(args.out).write_text(json.dumps({"runs": results, "checks": checks}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
