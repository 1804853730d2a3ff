#!/usr/bin/env python3
"""Records a preparation trace on a GPU: the operations PyTorch asked vmmarena for while it ran
a warmup catalog of bench/torch_workload.py, for vmmarena-replay.

    record_trace.py bench/traces/default.trace.gz                          # built into the replay
    record_trace.py bench/traces/ascending.trace.gz --catalog ascending
    record_trace.py bench/traces/shuffled110.trace.gz --catalog shuffled110

The catalog (torch_workload.CATALOGS) is a randomly initialised Llama-style decoder in bf16
made from a transformers config with no download, its weights loaded as vmmarena package
memory; then, under a retention scope, its warmup steps, each in its own `transient()`: an
eager forward, a side-stream warmup of the capture path, a CUDA graph capture and one replay.
Every tenth step also keeps its graph's input as package memory (graph operands). Each
catalog records in well under 2 minutes on an H200.

Needs torch (2.11) and transformers (5.x) with CUDA, and libvmmarena_torch.so: $VMMARENA_LIBRARY,
--library, or the first build*/shim/libvmmarena_torch.so of this checkout.

Usage: record_trace.py OUT.trace.gz [--catalog NAME] [--library PATH] [--seed N]
The workload runs in a child process with VMMARENA_TRACE set before the shim loads and
VMMARENA_RETAIN=on; the finished trace is checked, then written gzip-compressed to OUT.
"""
import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_workload  # noqa: E402  (the catalogs and the workload)

DEFAULT_SEED = torch_workload.DEFAULT_SEED
WORKER_TIMEOUT_S = 600


# ---- Process plumbing (shared with bench_torch.py) -------------------------------------


def find_library(given=None):
    """Path of libvmmarena_torch.so: `given`, $VMMARENA_LIBRARY, or a build of this checkout."""
    for path in (given, os.environ.get("VMMARENA_LIBRARY")):
        if path:
            if not os.path.isfile(path):
                sys.exit(f"libvmmarena_torch.so: {path}: no such file")
            return os.path.abspath(path)
    builds = sorted(REPO.glob("build*/shim/libvmmarena_torch.so"), key=lambda p: (p.parent.parent.name != "build", p))
    if not builds:
        sys.exit(
            "libvmmarena_torch.so not found: build it (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && "
            "cmake --build build --target vmmarena_torch), or pass --library / set VMMARENA_LIBRARY"
        )
    return str(builds[0])


def import_vmmarena(package_dir=None):
    """The vmmarena package: from `package_dir` (a folder holding vmmarena/) when given,
    else this checkout's shim/python."""
    sys.path.insert(0, str(package_dir or REPO / "shim" / "python"))
    import vmmarena

    return vmmarena


def check_trace(text):
    """Counts the operations of a finished trace; exits with what is wrong if it is not one."""
    if not text.startswith("vmmtrace 2\n"):  # the version the library writes (docs/trace.md)
        sys.exit(f"trace does not start with 'vmmtrace 2': {text[:40]!r}")
    if not text.endswith("\n"):
        sys.exit("trace ends in the middle of a line: the recording process did not exit cleanly")
    counts = {}
    for line in text.splitlines()[1:]:
        if not line or line.startswith("#"):
            continue
        fields = line.split(" ")
        if len(fields) != 10:
            sys.exit(f"malformed trace line: {line!r}")
        counts[fields[1]] = counts.get(fields[1], 0) + 1
    if counts.get("begin") != 1 or counts.get("finish") != 1:
        sys.exit(f"expected one retention scope (one begin, one finish), found {counts}")
    return counts


def worker(seed, catalog):
    vmmarena = import_vmmarena()
    import torch

    storage = vmmarena.Storage(0)
    warmup_s, _, operands = torch_workload.run_workload(torch, storage, seed, torch_workload.get(catalog))
    snap = storage.snapshot()
    totals, pool = snap["totals"], snap["pool"]
    print(
        f"recorded: warmup {warmup_s:.1f} s, {len(operands)} graph operands, physical peak "
        f"{totals['physical_peak_bytes'] / 2**30:.2f} GiB, pool hits {pool['hits']}, misses {pool['misses']}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the gzip trace")
    parser.add_argument("--library", help="path of libvmmarena_torch.so")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--catalog", default="default", choices=sorted(torch_workload.CATALOGS), help="the warmup catalog (default: default)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.seed, args.catalog)
        return
    if not args.out:
        parser.error("the output path is required")
    env = dict(os.environ, VMMARENA_LIBRARY=find_library(args.library), VMMARENA_RETAIN="on")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.txt"
        env["VMMARENA_TRACE"] = str(raw)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--worker", "--seed", str(args.seed), "--catalog", args.catalog],
            env=env,
            check=True,
            timeout=WORKER_TIMEOUT_S,
        )
        if not raw.exists():
            sys.exit(f"the workload wrote no trace at {raw}: was VMMARENA_TRACE read by the shim?")
        text = raw.read_text()
    counts = check_trace(text)
    with open(args.out, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(text.encode())
    ops = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
    print(f"{args.out}: {sum(counts.values())} operations ({ops}) in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
