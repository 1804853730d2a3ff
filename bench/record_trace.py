#!/usr/bin/env python3
"""Records a preparation trace on a GPU: the trace that vmmarena-replay builds in
(bench/traces/default.trace.gz).

The workload, which bench_torch.py runs too: a randomly initialised Llama-style decoder
(hidden 2048, 8 layers, 16 heads, MLP 5632, vocab 32000, bf16) made from a transformers config
with no download, its weights loaded as vmmarena package memory; then, under a retention scope,
a warmup catalog of 30 steps (batch 1..32 x seq 64..1024, each shape once, in a seeded order),
each in its own transient pool: an eager forward, a side-stream warmup of the capture path, a
CUDA graph capture and one replay. Every tenth step also keeps its graph's input as package
memory (graph operands). Takes well under 3 minutes on an H200.

Needs torch (2.11) and transformers (5.x) with CUDA, and libvmmarena_torch.so: $VMMARENA_LIBRARY,
--library, or the first build*/shim/libvmmarena_torch.so of this checkout.

Usage: record_trace.py OUT.trace.gz [--library PATH] [--seed N]
The workload runs in a child process with VMMARENA_TRACE set before the shim loads and
VMMARENA_RETAIN=on; the finished trace is checked, then written gzip-compressed to OUT.
"""
import argparse
import contextlib
import gzip
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_CONFIG = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=32000,
    max_position_embeddings=2048,
)
BATCHES = (1, 2, 4, 8, 16, 32)
SEQS = (64, 128, 256, 512, 1024)
OPERAND_EVERY = 10  # every tenth step keeps its graph input as package memory
FINAL_SHAPE = (2, 128)  # the forward whose logits bench_torch.py compares
FORWARD = dict(use_cache=False, logits_to_keep=1)  # prefill warmup: last-token logits only
DEFAULT_SEED = 1234
WORKER_TIMEOUT_S = 600


# ---- The workload (imported by bench_torch.py) -----------------------------------------


def catalog(seed):
    """The warmup steps: every (batch, seq) of the grid once, in a seeded order."""
    shapes = [(b, s) for b in BATCHES for s in SEQS]
    random.Random(seed).shuffle(shapes)
    return shapes


def _context(storage, name, *args):
    """storage.<name>(*args), or nothing when running on PyTorch's own allocator."""
    return getattr(storage, name)(*args) if storage is not None else contextlib.nullcontext()


def build_model(torch, storage, seed):
    """The decoder, randomly initialised on the GPU in bf16, as package memory."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**MODEL_CONFIG)
    torch.manual_seed(seed)
    with _context(storage, "package"), _context(storage, "tag", "weights"), torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        if next(model.parameters()).dtype != torch.bfloat16:
            model = model.to(torch.bfloat16)
    return model.eval()


def _random_ids(torch, shape, seed):
    generator = torch.Generator(device="cuda")
    generator.manual_seed(seed)
    return torch.randint(0, MODEL_CONFIG["vocab_size"], shape, device="cuda", generator=generator)


def _capture_and_replay(torch, model, storage, ids):
    """Warms the capture path on a side stream (as CUDA graph capture requires), captures one
    forward into a graph whose memory is the open step's, replays it, then drops the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(input_ids=ids, **FORWARD)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with storage.graph(graph) if storage is not None else torch.cuda.graph(graph):
        out = model(input_ids=ids, **FORWARD).logits
    graph.replay()
    torch.cuda.synchronize()
    del out
    graph.reset()


def warmup(torch, model, storage, seed):
    """The warmup catalog, under a retention scope when storage is given. Returns the graph
    operands kept as package memory."""
    operands = []
    with _context(storage, "retain_transient_backing"), torch.no_grad():
        for step, shape in enumerate(catalog(seed)):
            with _context(storage, "transient"), _context(storage, "tag", "warmup"):
                ids = _random_ids(torch, shape, seed + step)
                model(input_ids=ids, **FORWARD)
                if step % OPERAND_EVERY == OPERAND_EVERY - 1:
                    with _context(storage, "package"), _context(storage, "tag", "graph"):
                        ids = ids.clone()
                    operands.append(ids)
                _capture_and_replay(torch, model, storage, ids)
    torch.cuda.synchronize()
    return operands


def final_logits(torch, model, storage, seed):
    """Full logits of one fixed forward after the warmup, as float32 on the CPU."""
    with _context(storage, "transient"), torch.no_grad():
        ids = _random_ids(torch, FINAL_SHAPE, seed + 1_000_000)
        return model(input_ids=ids, use_cache=False).logits.float().cpu()


def run_workload(torch, storage, seed):
    """Loads the model, runs the warmup catalog and the final forward. Returns
    (warmup seconds, final logits, graph operands)."""
    model = build_model(torch, storage, seed)
    torch.cuda.synchronize()
    start = time.perf_counter()
    operands = warmup(torch, model, storage, seed)
    warmup_s = time.perf_counter() - start
    return warmup_s, final_logits(torch, model, storage, seed), operands


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


def import_vmmarena():
    sys.path.insert(0, str(REPO / "shim" / "python"))
    import vmmarena

    return vmmarena


def check_trace(text):
    """Counts the operations of a finished trace; exits with what is wrong if it is not one."""
    if not text.startswith("vmmtrace 1\n"):
        sys.exit(f"trace does not start with 'vmmtrace 1': {text[:40]!r}")
    if not text.endswith("\n"):
        sys.exit("trace ends in the middle of a line: the recording process did not exit cleanly")
    counts = {}
    for line in text.splitlines()[1:]:
        if not line or line.startswith("#"):
            continue
        fields = line.split(" ")
        if len(fields) != 9:
            sys.exit(f"malformed trace line: {line!r}")
        counts[fields[1]] = counts.get(fields[1], 0) + 1
    if counts.get("begin") != 1 or counts.get("finish") != 1:
        sys.exit(f"expected one retention scope (one begin, one finish), found {counts}")
    return counts


def worker(seed):
    vmmarena = import_vmmarena()
    import torch

    storage = vmmarena.Storage(0)
    warmup_s, _, operands = run_workload(torch, storage, seed)
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.seed)
        return
    if not args.out:
        parser.error("the output path is required")
    env = dict(os.environ, VMMARENA_LIBRARY=find_library(args.library), VMMARENA_RETAIN="on")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.txt"
        env["VMMARENA_TRACE"] = str(raw)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, __file__, "--worker", "--seed", str(args.seed)], env=env, check=True, timeout=WORKER_TIMEOUT_S
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
