#!/usr/bin/env python3
"""Writes synthetic-catalog.trace.gz: a synthetic vmmarena operation trace (format 'vmmtrace 1',
docs/trace.md) shaped like a model-preparation pipeline.

  1. Weights: package allocations of a Llama-3-8B-like decoder in bf16 (hidden 4096, 32 layers,
     32 heads, 8 KV heads, MLP 14336, vocab 128256), one per large tensor plus shared 2 MiB
     segments for the small ones, as PyTorch's caching allocator would ask for them.
  2. A retention scope with 60 warmup steps: 30 shapes (batch 1..32 x seq 64..1024) warmed twice,
     each pass in its own seeded order. A step allocates the eager forward's transient working
     set on the default stream, then the graph capture's on a side stream, and frees both when
     the step's transient pool is released. Sizes follow batch x seq (activations, MLP) and
     batch x seq^2 (eager attention scores, bf16 and the fp32 softmax).
  3. Every tenth step also allocates graph operands (static inputs and logits) as package
     memory inside the scope; they stay live for serving.

Deterministic: the same output bytes on every run (fixed seed, gzip mtime 0).
Usage: make_synthetic.py [OUT]   (default: synthetic-catalog.trace.gz beside this script)
"""
import gzip
import os
import random
import sys

MIB = 1 << 20
GRANULE = 2 * MIB
HIDDEN, LAYERS, HEADS, KV_HEADS, MLP, VOCAB = 4096, 32, 32, 8, 14336, 128256
HEAD_DIM = HIDDEN // HEADS
BF16, FP32 = 2, 4
BATCHES = (1, 2, 4, 8, 16, 32)
SEQS = (64, 128, 256, 512, 1024)
DEFAULT_STREAM = 0x0
CAPTURE_STREAM = 0x55D0C8A3E2A0
SEED = 20261202


def segment_bytes(tensor_bytes):
    """The segment PyTorch's caching allocator requests for a tensor: small tensors share a
    2 MiB segment, 1..10 MiB ones a 20 MiB segment, larger ones get their own, 2 MiB-rounded."""
    if tensor_bytes <= MIB:
        return 2 * MIB
    if tensor_bytes < 10 * MIB:
        return 20 * MIB
    return (tensor_bytes + GRANULE - 1) // GRANULE * GRANULE


class Trace:
    """Emits trace lines with a bump address space: every allocation gets a fresh base."""

    def __init__(self):
        self.lines = ["vmmtrace 1", "# synthetic preparation catalog (bench/traces/make_synthetic.py)"]
        self.t_ns = 0
        self.next_ptr = 0x7F8A00000000

    def _emit(self, op, kind, requested, rounded, ptr, stream, tag, gap_ns):
        self.t_ns += gap_ns
        self.lines.append(f"{self.t_ns} {op} {kind} {requested} {rounded} {ptr:#x} {stream:#x} {tag} VMM_OK")

    def alloc(self, kind, requested, stream, tag):
        rounded = (requested + GRANULE - 1) // GRANULE * GRANULE
        ptr = self.next_ptr
        self.next_ptr += rounded
        self._emit("alloc", kind, requested, rounded, ptr, stream, tag, 2_000)
        return ptr, rounded

    def free(self, kind, block, stream, tag):
        ptr, rounded = block
        self._emit("free", kind, 0, rounded, ptr, stream, tag, 1_000)

    def scope(self, op):
        self.lines.append(f"{self.t_ns} {op} - 0 0 0x0 0x0 - VMM_OK")

    def compute(self, ns):
        self.t_ns += ns


def weight_tensors():
    """Byte sizes of the model's tensors in load order."""
    sizes = [VOCAB * HIDDEN * BF16]  # token embedding
    per_layer = [
        HIDDEN * HIDDEN * BF16,  # q_proj
        HIDDEN * KV_HEADS * HEAD_DIM * BF16,  # k_proj
        HIDDEN * KV_HEADS * HEAD_DIM * BF16,  # v_proj
        HIDDEN * HIDDEN * BF16,  # o_proj
        HIDDEN * MLP * BF16,  # gate_proj
        HIDDEN * MLP * BF16,  # up_proj
        MLP * HIDDEN * BF16,  # down_proj
        HIDDEN * BF16,  # input_layernorm
        HIDDEN * BF16,  # post_attention_layernorm
    ]
    sizes += per_layer * LAYERS
    sizes += [HIDDEN * BF16, VOCAB * HIDDEN * BF16]  # final norm, lm_head
    return sizes


def load_weights(trace):
    small_left = 0  # bytes left in the current shared small-tensor segment
    for size in weight_tensors():
        if size <= MIB:
            if size > small_left:
                trace.alloc("package", 2 * MIB, DEFAULT_STREAM, "weights")
                small_left = 2 * MIB
            small_left -= size
            continue
        trace.alloc("package", segment_bytes(size), DEFAULT_STREAM, "weights")
        trace.compute(50_000)


def working_set(batch, seq):
    """Transient tensors of one forward at this shape, in allocation order."""
    tokens = batch * seq
    return [
        tokens * HIDDEN * BF16,  # residual stream
        tokens * HIDDEN * BF16,  # normed hidden states
        tokens * HIDDEN * BF16,  # queries
        tokens * KV_HEADS * HEAD_DIM * BF16,  # keys
        tokens * KV_HEADS * HEAD_DIM * BF16,  # values
        batch * HEADS * seq * seq * BF16,  # attention scores
        batch * HEADS * seq * seq * FP32,  # softmax in fp32
        tokens * HIDDEN * BF16,  # attention output
        tokens * MLP * BF16,  # gate
        tokens * MLP * BF16,  # up
        tokens * MLP * BF16,  # activation product
        batch * VOCAB * FP32,  # last-token logits
        tokens * 8,  # position ids
    ]


def warmup_step(trace, batch, seq, step):
    live = []
    for stream, tag in ((DEFAULT_STREAM, "warmup"), (CAPTURE_STREAM, "capture")):
        for size in working_set(batch, seq):
            live.append((trace.alloc("transient", segment_bytes(size), stream, tag), stream, tag))
        trace.compute(batch * seq * 2_000)
    if step % 10 == 9:
        trace.alloc("package", segment_bytes(batch * seq * 8), CAPTURE_STREAM, "graph")
        trace.alloc("package", segment_bytes(batch * VOCAB * BF16), CAPTURE_STREAM, "graph")
    for block, stream, tag in reversed(live):
        trace.free("transient", block, stream, tag)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "synthetic-catalog.trace.gz")
    rng = random.Random(SEED)
    shapes = [(b, s) for b in BATCHES for s in SEQS]
    steps = []
    for _ in range(2):
        order = shapes[:]
        rng.shuffle(order)
        steps += order
    trace = Trace()
    load_weights(trace)
    trace.scope("begin")
    for i, (batch, seq) in enumerate(steps):
        warmup_step(trace, batch, seq, i)
    trace.scope("finish")
    data = ("\n".join(trace.lines) + "\n").encode()
    with open(out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
            gz.write(data)
    ops = len(trace.lines) - 2
    print(f"{out}: {ops} operations, {len(steps)} warmup steps")


if __name__ == "__main__":
    main()
