"""Where a warmup step's memory goes, read from PyTorch's own view of its segments
(torch.cuda.memory._snapshot(), a private function that the PyTorch memory docs describe; this
module is used by bench_torch.py only, and says so when it is missing).

At each phase of each step (after the eager forward, after the side-stream forward, after the
capture, after the replay, after the step) the segments PyTorch holds are summed by pool
(default, package, step, graph, earlier graphs, released pools) and by stream (default, this
step's side stream, the capture stream, earlier side streams), with the bytes of live blocks
in them. After the step it lists the live blocks outside the package and default pools, and
after the catalog which blocks are cuBLAS workspaces (the blocks that
torch._C._cuda_clearCublasWorkspaces() frees).
"""
import time

PROBED = ("eager", "side", "captured", "replayed", "end")
GIB = float(1 << 30)


def segments(torch, device=0):
    """PyTorch's segments on `device` (dicts of torch.cuda.memory._snapshot()), or None where
    that function does not exist."""
    snapshot = getattr(torch.cuda.memory, "_snapshot", None)
    if snapshot is None:
        return None
    return [s for s in snapshot()["segments"] if s.get("device", device) == device]


def pool_id(segment):
    return tuple(segment.get("segment_pool_id") or (0, 0))


def default_pool_bytes(torch):
    """Bytes of the segments of PyTorch's default pool (its own cudaMalloc), or None."""
    found = segments(torch)
    if found is None:
        return None
    return sum(s["total_size"] for s in found if pool_id(s) == (0, 0))


def live_blocks(segment):
    return [b for b in segment.get("blocks", []) if b.get("state") == "active_allocated"]


class Probe:
    """Observer of torch_workload's steps (see the module docstring)."""

    def __init__(self, torch, storage):
        self.torch, self.storage = torch, storage
        self.steps = []
        self.graph_pools = []  # native: every graph's pool id, in capture order
        self.graph_pool = None  # this step's graph's pool
        self.side = None
        self.own_s = 0.0
        self.workspaces = None
        self.available = segments(torch) is not None

    # -- labels --

    def pool_labels(self):
        labels = {(0, 0): "default"}
        for pid in self.graph_pools:
            labels[pid] = "earlier graphs"
        storage = self.storage
        if storage is not None:
            if storage._package_pool is not None:
                labels[tuple(storage._package_pool.id)] = "package"
            for entry in storage._stack():
                if entry["kind"] == "transient" and entry["pool"] is not None:
                    labels[tuple(entry["pool"].id)] = "step"
            for graph, pool in storage._graph_pools:
                labels[tuple(pool.id)] = "earlier graphs"
        if self.graph_pool is not None:
            labels[self.graph_pool] = "graph"
        return labels

    def stream_labels(self):
        torch = self.torch
        labels = {torch.cuda.default_stream(0).cuda_stream: "default"}
        capture = getattr(torch.cuda.graph, "default_capture_stream", None)
        if capture is not None:
            labels[capture.cuda_stream] = "capture"
        if self.side is not None:
            labels[self.side] = "side"
        return labels

    # -- probing --

    def summary(self, segs, with_blocks):
        pools, streams = self.pool_labels(), self.stream_labels()
        by = {}
        blocks = []
        for s in segs:
            pool = pools.get(pool_id(s), "released pools")
            stream = streams.get(s.get("stream"), "earlier side streams")
            live = live_blocks(s)
            key = f"{pool}|{stream}"
            row = by.setdefault(key, {"segments": 0, "reserved": 0, "live": 0})
            row["segments"] += 1
            row["reserved"] += s["total_size"]
            row["live"] += sum(b["size"] for b in live)
            if with_blocks and pool not in ("package", "default"):
                blocks += [
                    {"pool": pool, "stream": stream, "size": b["size"], "segment": s["total_size"], "at": s["address"]}
                    for b in live
                ]
        out = {"by": by, "reserved": sum(s["total_size"] for s in segs)}
        if with_blocks:
            out["live_blocks_outside_package"] = blocks
        if self.storage is not None:
            out["vmm_physical"] = self.storage.snapshot()["totals"]["physical_bytes"]
        return out

    def __call__(self, step, phase, **info):
        if not self.available:
            return
        t0 = time.perf_counter()
        if phase == "start":
            self.steps.append({"step": step, "shape": list(info["shape"]), "phases": {}})
            self.graph_pool = self.side = None
        elif phase == "side":
            self.side = info["stream"].cuda_stream
        elif phase == "captured":
            self.graph_pool = tuple(info["graph"].pool())
        if phase in PROBED:
            self.steps[-1]["phases"][phase] = self.summary(segments(self.torch), phase == "end")
        if phase == "end" and self.storage is None and self.graph_pool is not None:
            self.graph_pools.append(self.graph_pool)
        self.own_s += time.perf_counter() - t0

    def finish(self):
        """After the catalog: which live blocks are cuBLAS workspaces."""
        clear = getattr(self.torch._C, "_cuda_clearCublasWorkspaces", None)
        if not self.available or clear is None:
            return
        self.torch.cuda.synchronize()
        before = segments(self.torch)
        clear()
        after = {b["address"] for s in segments(self.torch) for b in live_blocks(s)}
        pools, streams = self.pool_labels(), self.stream_labels()
        self.workspaces = [
            {
                "pool": pools.get(pool_id(s), "released pools"),
                "stream": streams.get(s.get("stream"), "earlier side streams"),
                "size": b["size"],
                "segment": s["total_size"],
            }
            for s in before
            for b in live_blocks(s)
            if b["address"] not in after
        ]

    def report(self):
        if not self.available:
            return {"error": "torch.cuda.memory._snapshot() is not available in this PyTorch"}
        return {"steps": self.steps, "workspaces": self.workspaces}


def both(*observers):
    def call(step, phase, **info):
        for o in observers:
            o(step, phase, **info)

    return call


# ---- Printing ----------------------------------------------------------------------------


def _gib(n):
    return f"{n / GIB:.2f}"


def _totals(by, index):
    out = {}
    for key, row in by.items():
        name = key.split("|")[index]
        out[name] = out.get(name, 0) + row["reserved"]
    return out


def print_summary(runs):
    """For each catalog: the step at which the first mode peaks, phase by phase in every mode,
    by pool and by stream; then the live blocks after that step and the workspaces."""
    for catalog, modes in runs.items():
        probed = {m: r["breakdown"] for m, r in modes.items() if r.get("breakdown", {}).get("steps")}
        if not probed:
            continue
        first = next(iter(probed.values()))
        peak = max(first["steps"], key=lambda s: max(p["reserved"] for p in s["phases"].values()))
        index = peak["step"]
        print(f"\n### {catalog}: step {index} (batch x seq {peak['shape'][0]} x {peak['shape'][1]}), GiB PyTorch holds\n")
        print("| mode | phase | total | by pool | by stream | vmmarena physical |")
        print("| --- | --- | ---: | --- | --- | ---: |")
        for mode, b in probed.items():
            step = b["steps"][index]
            for phase in PROBED:
                p = step["phases"].get(phase)
                if p is None:
                    continue
                pools = ", ".join(f"{k} {_gib(v)}" for k, v in sorted(_totals(p["by"], 0).items()))
                streams = ", ".join(f"{k} {_gib(v)}" for k, v in sorted(_totals(p["by"], 1).items()))
                vmm = _gib(p["vmm_physical"]) if "vmm_physical" in p else "-"
                print(f"| {mode} | {phase} | {_gib(p['reserved'])} | {pools} | {streams} | {vmm} |")
        for mode, b in probed.items():
            end = b["steps"][index]["phases"]["end"]
            blocks = end.get("live_blocks_outside_package", [])
            held = sum({x.get("at", i): x["segment"] for i, x in enumerate(blocks)}.values())  # each segment once
            print(
                f"{mode}: after step {index}, {len(blocks)} live blocks outside package/default pools, "
                f"{sum(x['size'] for x in blocks) / 2**20:.0f} MiB in segments of {held / 2**20:.0f} MiB"
            )
            ws = b.get("workspaces")
            if ws is not None:
                pools = {}
                for x in ws:
                    pools[x["pool"]] = pools.get(x["pool"], 0) + x["size"]
                where = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(pools.items()))
                print(
                    f"{mode}: after the catalog, {len(ws)} cuBLAS workspaces, "
                    f"{sum(x['size'] for x in ws) / 2**20:.0f} MiB ({where})"
                )
