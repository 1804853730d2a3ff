"""The PyTorch preparation workload that record_trace.py records and bench_torch.py measures.

A catalog is a randomly initialised Llama-style decoder (bf16, built from a transformers config,
no download) and a list of warmup steps. Each step runs in its own `storage.transient()` (or
on PyTorch's own allocator when no storage is given): an eager forward, the same forward on a
new side stream (the warmup that CUDA graph capture needs), a CUDA graph capture and one
replay. Every `operand_every`-th step also keeps its graph's input as package memory (graph
operands). After the catalog one fixed forward gives the logits that the benchmark compares.

Catalogs (`CATALOGS`, chosen by name):

  default      hidden 2048, 8 layers, 16 heads, MLP 5632, vocab 32000;
               batch 1..32 x seq 64..1024, 30 steps in a seeded order (the recorded
               bench/traces/default.trace.gz)
  ascending    hidden 2560, 6 layers, 20 heads (4 key/value heads), MLP 6912, vocab 49152;
               batch 1..24 x seq 96..2048, 30 steps, smallest to largest
  shuffled110  hidden 1536, 12 layers, 12 heads, MLP 4096, vocab 50304;
               batch 1..48 x seq 32..1024, 110 steps in a seeded order
  smallpool    hidden 512, 4 layers, 8 heads, MLP 1408, vocab 8192; batch 1..8 x seq 8..128,
               20 steps, largest first: small tensors (most below 2 MiB), three side-stream
               forwards per step, and every step's graph captured into one shared pool
               (pool=) and kept until the catalog ends, as serving engines keep their graphs

An observer (any callable) sees every phase of every step: `observer(step, phase, **info)`
with phase in PHASES; "side" passes the side stream, "captured" the graph. The benchmark uses
it for the memory held after each step and for the per-phase breakdown.

torch and transformers are passed in or imported by the functions that need them, so that
this module imports on a machine without them.
"""
import contextlib
import dataclasses
import random
import time

DEFAULT_SEED = 1234
FORWARD = dict(use_cache=False, logits_to_keep=1)  # prefill warmup: last-token logits only
PHASES = ("start", "entered", "eager", "side", "captured", "replayed", "left", "end")


@dataclasses.dataclass(frozen=True)
class Catalog:
    name: str
    model: dict  # LlamaConfig keyword arguments
    batches: tuple
    seqs: tuple
    order: str  # "shuffled" (seeded) or "ascending" (by tokens, then sequence length)
    operand_every: int = 10  # every n-th step keeps its graph input as package memory
    final_shape: tuple = (2, 128)  # the forward whose logits the benchmark compares
    side_streams: int = 1  # side-stream forwards per step, each on a new stream
    share_pool: bool = False  # the graphs share one pool and live until the catalog ends

    def shapes(self, seed):
        """The warmup steps: every (batch, seq) of the grid once, in the catalog's order."""
        grid = [(b, s) for b in self.batches for s in self.seqs]
        if self.order == "shuffled":
            random.Random(seed).shuffle(grid)
        elif self.order == "ascending":
            grid.sort(key=lambda shape: (shape[0] * shape[1], shape[1]))
        elif self.order == "descending":
            grid.sort(key=lambda shape: (shape[0] * shape[1], shape[1]), reverse=True)
        else:
            raise ValueError(f"catalog {self.name}: unknown order {self.order!r}")
        return grid

    def describe(self):
        m = self.model
        kv = m["num_key_value_heads"]
        heads = f"{m['num_attention_heads']} heads" + (f" ({kv} key/value)" if kv != m["num_attention_heads"] else "")
        extra = ""
        if self.side_streams != 1:
            extra += f", {self.side_streams} side-stream forwards per step"
        if self.share_pool:
            extra += ", graphs in one shared pool, kept"
        return (
            f"hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, {heads}, MLP {m['intermediate_size']}, "
            f"vocab {m['vocab_size']}; batch {self.batches[0]}..{self.batches[-1]} x seq {self.seqs[0]}..{self.seqs[-1]}, "
            f"{len(self.batches) * len(self.seqs)} steps, {self.order}{extra}"
        )


CATALOGS = {
    c.name: c
    for c in (
        Catalog(
            name="default",
            model=dict(
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=8,
                num_attention_heads=16,
                num_key_value_heads=16,
                vocab_size=32000,
                max_position_embeddings=2048,
            ),
            batches=(1, 2, 4, 8, 16, 32),
            seqs=(64, 128, 256, 512, 1024),
            order="shuffled",
        ),
        Catalog(
            name="ascending",
            model=dict(
                hidden_size=2560,
                intermediate_size=6912,
                num_hidden_layers=6,
                num_attention_heads=20,
                num_key_value_heads=4,
                vocab_size=49152,
                max_position_embeddings=4096,
            ),
            batches=(1, 3, 6, 12, 24),
            seqs=(96, 192, 384, 768, 1536, 2048),
            order="ascending",
        ),
        Catalog(
            name="shuffled110",
            model=dict(
                hidden_size=1536,
                intermediate_size=4096,
                num_hidden_layers=12,
                num_attention_heads=12,
                num_key_value_heads=12,
                vocab_size=50304,
                max_position_embeddings=2048,
            ),
            batches=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48),
            seqs=(32, 64, 96, 128, 192, 256, 384, 512, 768, 1024),
            order="shuffled",
        ),
        Catalog(
            name="smallpool",
            model=dict(
                hidden_size=512,
                intermediate_size=1408,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=8,
                vocab_size=8192,
                max_position_embeddings=1024,
            ),
            batches=(1, 2, 4, 8),
            seqs=(8, 16, 32, 64, 128),
            order="descending",
            operand_every=5,
            final_shape=(2, 64),
            side_streams=3,
            share_pool=True,
        ),
    )
}


def get(name):
    """The catalog called `name`; a ValueError lists the names there are."""
    try:
        return CATALOGS[name]
    except KeyError:
        raise ValueError(f"no catalog {name!r}: choose one of {', '.join(CATALOGS)}") from None


def _context(storage, name, *args):
    """storage.<name>(*args), or nothing when running on PyTorch's own allocator."""
    return getattr(storage, name)(*args) if storage is not None else contextlib.nullcontext()


def _ignore(step, phase, **info):
    pass


def build_model(torch, storage, seed, catalog):
    """The decoder, randomly initialised on the GPU in bf16, as package memory."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**catalog.model)
    torch.manual_seed(seed)
    with _context(storage, "package"), _context(storage, "tag", "weights"), torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        if next(model.parameters()).dtype != torch.bfloat16:
            model = model.to(torch.bfloat16)
    return model.eval()


def _random_ids(torch, shape, seed, vocab):
    generator = torch.Generator(device="cuda")
    generator.manual_seed(seed)
    return torch.randint(0, vocab, shape, device="cuda", generator=generator)


def _graph_context(torch, storage, graph, kept):
    """The capture of `graph`: into a pool of its own, or (kept is a list: the catalog shares
    one pool) into the pool of the first kept graph."""
    if kept is None or not kept:
        return storage.graph(graph) if storage is not None else torch.cuda.graph(graph)
    if storage is not None:
        return storage.graph(graph, share_with=kept[0])
    return torch.cuda.graph(graph, pool=kept[0].pool())


def _capture_and_replay(torch, model, storage, ids, step, observer, side_streams=1, kept=None):
    """Warms the capture path on new side streams (as CUDA graph capture requires), captures
    one forward into a graph whose memory is the open step's, replays it, then drops the
    graph, or appends it to `kept` (the catalog's graphs sharing one pool)."""
    for _ in range(side_streams):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(input_ids=ids, **FORWARD)
        torch.cuda.current_stream().wait_stream(side)
    observer(step, "side", stream=side)
    graph = torch.cuda.CUDAGraph()
    with _graph_context(torch, storage, graph, kept):
        out = model(input_ids=ids, **FORWARD).logits
    observer(step, "captured", graph=graph)
    graph.replay()
    torch.cuda.synchronize()
    observer(step, "replayed", graph=graph)
    del out
    if kept is None:
        graph.reset()
    else:
        kept.append(graph)


def warmup(torch, model, storage, seed, catalog, observer=_ignore):
    """The warmup catalog, under a retention scope when storage is given. Returns the graph
    operands kept as package memory."""
    operands = []
    vocab = catalog.model["vocab_size"]
    every = catalog.operand_every
    kept = [] if catalog.share_pool else None
    with _context(storage, "retain_transient_backing"), torch.no_grad():
        for step, shape in enumerate(catalog.shapes(seed)):
            observer(step, "start", shape=shape)
            with _context(storage, "transient"), _context(storage, "tag", "warmup"):
                observer(step, "entered")
                ids = _random_ids(torch, shape, seed + step, vocab)
                model(input_ids=ids, **FORWARD)
                observer(step, "eager")
                if step % every == every - 1:
                    with _context(storage, "package"), _context(storage, "tag", "graph"):
                        ids = ids.clone()
                    operands.append(ids)
                _capture_and_replay(torch, model, storage, ids, step, observer, catalog.side_streams, kept)
                observer(step, "left")
            observer(step, "end")
        if kept:
            torch.cuda.synchronize()
            del kept[:]  # the shared pool goes with its last graph
    torch.cuda.synchronize()
    return operands


def final_logits(torch, model, storage, seed, catalog):
    """Full logits of one fixed forward after the warmup, as float32 on the CPU."""
    with _context(storage, "transient"), torch.no_grad():
        ids = _random_ids(torch, catalog.final_shape, seed + 1_000_000, catalog.model["vocab_size"])
        return model(input_ids=ids, use_cache=False).logits.float().cpu()


def timed_warmup(torch, model, storage, seed, catalog, observer=_ignore):
    """Runs the catalog after a device synchronize; returns (seconds, graph operands)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    operands = warmup(torch, model, storage, seed, catalog, observer)
    return time.perf_counter() - start, operands


def run_workload(torch, storage, seed, catalog):
    """Loads the model, runs the warmup catalog and the final forward. Returns
    (warmup seconds, final logits, graph operands)."""
    model = build_model(torch, storage, seed, catalog)
    warmup_s, operands = timed_warmup(torch, model, storage, seed, catalog)
    return warmup_s, final_logits(torch, model, storage, seed, catalog), operands
