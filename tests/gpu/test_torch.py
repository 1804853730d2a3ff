"""GPU tests of libvmmarena_torch.so and the vmmarena package under PyTorch (run by
tests/gpu/run; needs a CUDA GPU, torch, VMMARENA_LIBRARY and PYTHONPATH=shim/python).

Run as a script: the tests share one process (one arena), run in order, and print a line each
and "torch: N passed, M failed". Settings that must hold from the arena's creation on
(VMMARENA_LIMIT, VMMARENA_REUSE, use_as_default) run in child processes of this same file.
"""

import os
import subprocess
import sys
import time

os.environ.setdefault("VMMARENA_RETAIN", "on")  # discrete GPUs retain only when asked
os.environ.setdefault("VMMARENA_LOG", "off")  # refusals are expected here; the tests read them

import torch  # noqa: E402

import vmmarena  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_suite import (check, check_listed, child_main, containing, is_child, load_kernels,  # noqa: E402
                       run, run_child, spin_cycles)

MiB = 1 << 20
GiB = 1 << 30
DEV = 0


# ---- Workloads (the same code runs on PyTorch's allocator and on vmmarena) -------------


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, width=256, heads=8):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def build_model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(256, 256)).eval().cuda()


def make_input(seed, batch=8, seq=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, 256, generator=g).cuda()


def matmul_product():
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(2048, 2048, device="cuda", generator=g)
    b = torch.randn(2048, 2048, device="cuda", generator=g)
    return a @ b


def assert_same(out, ref, what):
    if not torch.equal(out, ref):
        diff = (out - ref).abs().max().item()
        raise AssertionError(f"{what}: differs from PyTorch's allocator (max abs diff {diff:g})")


# ---- Child processes: settings fixed at arena creation ---------------------------------


def child(mode, env):
    """Runs this file as `--child mode` with `env` added; returns its RESULT json."""
    return run_child(__file__, mode, env=env)


def child_warmups():
    storage = vmmarena.Storage(DEV)
    model, x = build_model(), make_input(3)
    model(x)  # cuBLAS workspaces on PyTorch's allocator, not in step 1's pool
    physical, hits, creates = [], [], []
    with torch.no_grad(), storage.retain_transient_backing():
        for _ in range(12):
            with storage.transient():
                model(x)
            snap = storage.snapshot()
            physical.append(snap["totals"]["physical_bytes"])
            hits.append(snap["pool"]["hits"])
            creates.append(snap["driver"]["cuMemCreate"]["calls"])
    return {"physical": physical, "hits": hits, "creates": creates}


def child_limit():
    storage = vmmarena.Storage(DEV)
    held, notes = [], []
    try:
        with storage.package():
            for _ in range(8):
                held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        notes = getattr(e, "__notes__", [])
    snap = storage.snapshot()
    return {
        "count": len(held),
        "message": storage.last_error(),
        "notes": notes,
        "physical": snap["totals"]["physical_bytes"],
        "limit_refusals": snap["refusals"]["limit"],
    }


def child_bad_config():
    try:
        vmmarena.Storage(DEV)
        storage_error = None
    except ValueError as e:
        storage_error = str(e)
    pool = torch.cuda.MemPool(vmmarena.allocator("package").allocator())
    oom = False
    try:
        with torch.cuda.use_mem_pool(pool):
            torch.empty(MiB, device="cuda")
    except torch.OutOfMemoryError:
        oom = True
    return {"storage_error": storage_error, "oom": oom, "last_error": vmmarena.last_error(DEV)}


def child_default():
    vmmarena.use_as_default()
    a = torch.randn(512, 512, device="cuda")
    product = a @ a
    torch.cuda.synchronize()
    close = torch.allclose(product.cpu(), a.cpu() @ a.cpu(), rtol=1e-3, atol=1e-3)
    errors = []
    try:
        vmmarena.use_as_default()
    except vmmarena.VmmarenaError as e:
        errors.append(str(e))
    try:
        with vmmarena.Storage(DEV).package():
            pass
    except vmmarena.VmmarenaError as e:
        errors.append(str(e))
    snap = vmmarena.snapshot(DEV)
    allocated = torch.cuda.memory_allocated(DEV)  # PyTorch's own would raise for a pluggable allocator
    torch.cuda.set_per_process_memory_fraction(0.5, DEV)
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # PyTorch 2.9 on
    fraction = getter(DEV) if getter else 0.5
    limit = vmmarena.snapshot(DEV)["limit_bytes"]
    torch.cuda.set_per_process_memory_fraction(1.0, DEV)
    return {"close": close, "package_live": snap["kinds"]["package"]["live_count"], "errors": errors,
            "allocated": allocated, "live_bytes": snap["kinds"]["package"]["live_bytes"], "fraction": fraction,
            "limit": limit, "total": torch.cuda.mem_get_info(DEV)[1]}


CHILDREN = {"warmups": child_warmups, "limit": child_limit, "bad_config": child_bad_config, "default": child_default}


# ---- Tests ------------------------------------------------------------------------------

storage = None
MODEL = X = REF = None
CAPTURE_STREAM = None


def setup():
    """Kernels, cuBLAS workspaces (default and capture stream) and references, all on
    PyTorch's own allocator, before any pool exists."""
    global storage, REF, CAPTURE_STREAM
    torch.set_grad_enabled(False)
    torch.cuda.set_device(DEV)
    CAPTURE_STREAM = torch.cuda.Stream()
    ref_model, x = build_model(), make_input(3)
    REF = {"matmul": matmul_product(), "model": ref_model(x)}
    with torch.cuda.stream(CAPTURE_STREAM):
        ref_model(x)
        matmul_product()
    torch.cuda.synchronize()
    del ref_model, x
    storage = vmmarena.Storage(DEV)


def test_matmul_matches_default_allocator():
    with storage.package():
        out = matmul_product()
    m = containing(storage.snapshot(), out.data_ptr())
    check(m and m["kind"] == "package", f"package result not in a package mapping: {m}")
    assert_same(out, REF["matmul"], "matmul in package()")
    with storage.transient():
        step_out = matmul_product()
        m = containing(storage.snapshot(), step_out.data_ptr())
        check(m and m["kind"] == "transient" and m["state"] == "live", f"step result mapping: {m}")
        assert_same(step_out, REF["matmul"], "matmul in transient()")
        del step_out
    check(storage.snapshot()["stray_transient"]["count"] == 0, "the step left transient memory behind")


def test_model_forward_matches_default_allocator():
    global MODEL, X
    with storage.package():
        MODEL, X = build_model(), make_input(3)
        assert_same(MODEL(X), REF["model"], "model forward in package()")
    weights = containing(storage.snapshot(), MODEL[0].qkv.weight.data_ptr())
    check(weights and weights["kind"] == "package", f"weights built in package() are in {weights}")
    with storage.transient():
        assert_same(MODEL(X), REF["model"], "model forward in transient()")


def test_twelve_warmups_reuse_the_first_steps_mappings():
    storage.release()
    s0 = storage.snapshot()
    with storage.retain_transient_backing():
        for step in range(12):
            with storage.transient():
                MODEL(X)
            if step == 0:
                s1 = storage.snapshot()
        s12 = storage.snapshot()
    end = storage.snapshot()
    made = s1["pool"]["misses"] - s0["pool"]["misses"]
    kept = s1["stray_transient"]["count"]  # segments step 1 did not give back
    hits = s12["pool"]["hits"] - s1["pool"]["hits"]
    grown = s1["totals"]["physical_bytes"] - s0["totals"]["physical_bytes"]
    print(f"  step 1 mapped {made} segment(s), {grown / MiB:.0f} MiB ({kept} kept); steps 2-12: {hits} pool hits")
    check(made >= 1 and grown > 0, f"step 1 made {made} mappings, {grown} bytes")
    check(s12["pool"]["misses"] == s1["pool"]["misses"], "a later step needed new memory")
    check(hits == 11 * (made - kept), f"{hits} hits for 11 steps of {made - kept} returned segments")
    check(s12["totals"]["physical_bytes"] == s1["totals"]["physical_bytes"], "physical memory grew")
    check(end["pool"]["retained_reusable_handles"] == 0, "finish left the pool full")
    check(end["totals"]["physical_bytes"] == s0["totals"]["physical_bytes"], "finish did not release")


def test_without_reuse_or_retention_no_mapping_is_reused():
    none = child("warmups", {"VMMARENA_REUSE": "none"})
    off = child("warmups", {"VMMARENA_RETAIN": "off"})
    on = child("warmups", {})
    runs = {"reuse none": none, "retain off": off, "exact": on}
    print("  physical MiB after steps 1 and 12: "
          + ", ".join(f"{name} {r['physical'][0] // MiB} -> {r['physical'][-1] // MiB}" for name, r in runs.items()))
    check(none["hits"][-1] == 0 and off["hits"][-1] == 0, (none["hits"], off["hits"]))
    check(none["physical"][-1] >= 10 * none["physical"][0] > 0, f"reuse none did not grow: {none['physical']}")
    per_step = off["creates"][0]
    check(off["creates"][-1] >= 12 * per_step > 0, f"retain off: cuMemCreate calls {off['creates']}")
    check(on["physical"][-1] == on["physical"][0] and on["hits"][-1] > 0, (on["physical"], on["hits"]))


def test_graph_captured_in_a_step_replays_after_finish():
    storage.release()
    g = torch.cuda.CUDAGraph()
    with storage.retain_transient_backing():
        with storage.transient():
            static_x = X.clone()
            allocs = storage.snapshot()["totals"]["allocs"]
            with storage.graph(g, stream=CAPTURE_STREAM):
                static_y = MODEL(static_x)
                scratch = torch.ones(64 * MiB // 4, device="cuda")  # needs a new segment
                static_sum = scratch.sum()
            made_in_capture = storage.snapshot()["totals"]["allocs"] - allocs
            g.replay()
            torch.cuda.synchronize()
            assert_same(static_y, MODEL(static_x), "graph replay in the step")
    strays = storage.snapshot()["stray_transient"]
    x_next = make_input(11)
    static_x.copy_(x_next)
    g.replay()  # after the scope finished
    torch.cuda.synchronize()
    check(made_in_capture >= 1, "no segment was allocated during capture")
    check(static_sum.item() == 64 * MiB // 4, f"graph replay summed {static_sum.item()}, expected {64 * MiB // 4}")
    assert_same(static_y, MODEL(x_next), "graph replay after finish")
    check(strays["count"] >= 1, "the graph's memory is not reported outside the step")
    del g, static_x, static_y, scratch, static_sum
    storage.release()
    check(storage.snapshot()["stray_transient"]["count"] == 0, "graph memory not returned")


def test_graph_captured_into_the_package_pool():
    g = torch.cuda.CUDAGraph()
    with storage.package():
        a = torch.randn(1024, 1024, device="cuda")
    allocs = storage.snapshot()["totals"]["allocs"]
    with storage.graph(g, stream=CAPTURE_STREAM):  # outside any context: package memory
        y = torch.relu(a @ a) + 1
    check(storage.snapshot()["totals"]["allocs"] > allocs, "the capture allocated nothing from vmmarena")
    a.copy_(torch.randn(1024, 1024, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    out = containing(storage.snapshot(), y.data_ptr())
    check(out and out["kind"] == "package", f"the graph's output is in {out}, not package memory")
    assert_same(y, torch.relu(a @ a) + 1, "package graph replay")
    del g, a, y


class _DeviceBytes:
    """`n` bytes at a raw device pointer, for torch.as_tensor (no copy, no ownership)."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "|u1", "data": (ptr, False), "strides": None, "version": 2
        }


SPIN_MS = 1500  # stream A's spin: far longer than the free and the reuse take on the host


def test_reuse_on_another_stream_while_the_first_is_busy():
    """The shim's own free and allocate, with PyTorch kernels on the memory: stream A is
    still running (a calibrated spin, then a fill of 1s) when its mapping is freed and handed
    to stream B, which fills 2s. An event after A's fill shows A busy at the free and at the
    reuse; without the ordering B's fill would run first and be overwritten."""
    n = 64 * MiB
    shim = vmmarena._lib.lib()
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = spin_cycles(SPIN_MS)
    load_kernels(stream_a, stream_b)
    a_done = torch.cuda.Event()
    with storage.retain_transient_backing():
        ptr = shim.vmm_torch_transient_allocate(n, DEV, stream_a.cuda_stream)
        check(ptr, storage.last_error())
        x = torch.as_tensor(_DeviceBytes(ptr, n), device="cuda")
        t0 = time.perf_counter()
        with torch.cuda.stream(stream_a):
            torch.cuda._sleep(cycles)
            x.fill_(1)
            a_done.record(stream_a)
        del x
        shim.vmm_torch_free(ptr, n, DEV, stream_a.cuda_stream)
        busy_at_free = not a_done.query()
        again = shim.vmm_torch_transient_allocate(n, DEV, stream_b.cuda_stream)
        check(again, storage.last_error())
        y = torch.as_tensor(_DeviceBytes(again, n), device="cuda")
        with torch.cuda.stream(stream_b):
            y.fill_(2)
        busy_at_reuse = not a_done.query()
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        intact = bool((y == 2).all())
        del y
        shim.vmm_torch_free(again, n, DEV, stream_b.cuda_stream)
    print(f"  spin {cycles} cycles (~{SPIN_MS} ms); free and reuse done {host_ms:.1f} ms after the launch")
    check(again == ptr, "stream B did not get the mapping stream A freed")
    check(busy_at_free, f"stream A had finished at the free ({host_ms:.0f} ms): nothing was tested")
    check(busy_at_reuse, f"stream A had finished at the reuse ({host_ms:.0f} ms): nothing was tested")
    check(intact, "stream B's fill was overwritten by stream A's: the reuse was not ordered")


def test_reuse_after_pytorch_releases_a_pool_on_another_stream():
    """The same through PyTorch: a MemPool dropped while its stream is busy returns the
    segment, and a pool on another stream gets it while stream A is still busy."""
    n = 64 * MiB
    stream_a, stream_b = torch.cuda.Stream(), torch.cuda.Stream()
    cycles = spin_cycles(SPIN_MS)
    load_kernels(stream_a, stream_b)
    transient = vmmarena.allocator("transient").allocator()
    a_done = torch.cuda.Event()
    with storage.retain_transient_backing():
        pool = torch.cuda.MemPool(transient)
        with torch.cuda.stream(stream_a), torch.cuda.use_mem_pool(pool):
            x = torch.empty(n, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        with torch.cuda.stream(stream_a):
            torch.cuda._sleep(cycles)
            x.fill_(1)
            a_done.record(stream_a)
        busy = {"launched": not a_done.query()}
        del x
        busy["tensor freed"] = not a_done.query()
        del pool  # ~MemPool hands the segment back: to vmmarena's pool, inside the scope
        busy["pool dropped"] = not a_done.query()
        pooled = storage.snapshot()["pool"]["retained_reusable_handles"]
        pool = torch.cuda.MemPool(transient)
        with torch.cuda.stream(stream_b), torch.cuda.use_mem_pool(pool):
            y = torch.empty(n, dtype=torch.uint8, device="cuda")
            busy["reused"] = not a_done.query()
            y.fill_(2)
        torch.cuda.synchronize()
        intact = bool((y == 2).all())
        reused = y.data_ptr() == ptr
        del y, pool
    print(f"  stream A busy: {busy}")
    check(pooled >= 1, "the segment did not reach vmmarena's pool")
    check(reused, "stream B did not get the mapping stream A freed")
    check(
        busy["reused"],
        f"stream A had finished when stream B reused its memory ({busy}): PyTorch or vmmarena waited, nothing was tested",
    )
    check(intact, "stream B's fill was overwritten by stream A's: the reuse was not ordered")


def test_capture_in_a_step_returns_the_steps_cached_blocks():
    """storage.graph() inside a step gives the step's free cached blocks back before the
    capture, as torch.cuda.graph() empties PyTorch's own cache: a step holds its eager
    forwards' memory or its graph's, not both."""
    g = torch.cuda.CUDAGraph()
    with storage.transient():
        big = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        big.fill_(3)
        del big  # cached free in the step's pool
        kept = torch.full((MiB,), 5, dtype=torch.uint8, device="cuda")  # live across the capture
        before = storage.snapshot()["kinds"]["transient"]["live_bytes"]
        with storage.graph(g, stream=CAPTURE_STREAM):
            out = kept * 2
        after_capture = storage.snapshot()["kinds"]["transient"]["live_bytes"]
        later = torch.ones(MiB, dtype=torch.uint8, device="cuda")  # the step goes on in a fresh pool
        in_step = containing(storage.snapshot(), later.data_ptr())
        g.replay()
        torch.cuda.synchronize()
        check(bool((out == 10).all()), "the graph read the live tensor wrongly")
        check(bool((kept == 5).all()), "a tensor alive across the capture lost its data")
        del later
    print(f"  transient live {before // MiB} MiB before the capture, {after_capture // MiB} MiB after")
    # The capture itself maps at most one 2 MiB segment (for `out`).
    check(
        before - after_capture >= 254 * MiB,
        f"the step's 256 MiB cached block was not given back (live transient {before} -> {after_capture} bytes)",
    )
    check(in_step and in_step["kind"] == "transient", f"after the capture the step allocated in {in_step}")
    del g, out, kept
    storage.release()
    check(storage.snapshot()["stray_transient"]["count"] == 0, "the step's memory did not come back")


def test_capture_in_a_step_reuses_the_steps_memory_under_retention():
    """Inside a retention scope the step's cached blocks go to vmmarena's pool before the
    capture, and the capture (on another stream) takes them instead of new memory."""
    g = torch.cuda.CUDAGraph()
    storage.release()
    with storage.retain_transient_backing():
        with storage.transient():
            big = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
            big.fill_(3)
            del big
            s0 = storage.snapshot()
            with storage.graph(g, stream=CAPTURE_STREAM):
                # Only the 256 MiB block: no operation here may need a temporary of its own
                # (a dtype-converting reduction would allocate one as large again, or larger).
                scratch = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
                scratch.fill_(4)
            s1 = storage.snapshot()
            g.replay()
            torch.cuda.synchronize()
            check(bool((scratch == 4).all()), "the graph's fill did not land")
    grown = s1["totals"]["physical_bytes"] - s0["totals"]["physical_bytes"]
    hits = s1["pool"]["hits"] - s0["pool"]["hits"]
    print(f"  the capture took {hits} pooled mapping(s); physical memory grew {grown // MiB} MiB")
    check(hits >= 1, "the capture did not take the step's pooled mapping")
    check(grown < 256 * MiB, f"the capture mapped {grown} new bytes instead of reusing the step's 256 MiB")
    del g, scratch
    storage.release()


def test_snapshot_fields_the_benchmark_reads():
    """bench/torch_breakdown.py reads torch.cuda.memory._snapshot(), a private function:
    this fails when the fields it relies on change."""
    snapshot = getattr(torch.cuda.memory, "_snapshot", None)
    check(snapshot is not None, "torch.cuda.memory._snapshot() is gone")
    pool = torch.cuda.MemPool(vmmarena.allocator("transient").allocator())
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    segs = [s for s in snapshot()["segments"] if any(b["address"] == x.data_ptr() for b in s.get("blocks", []))]
    check(len(segs) == 1, f"{len(segs)} segments hold the tensor")
    seg = segs[0]
    for key in ("total_size", "stream", "segment_pool_id", "blocks", "device"):
        check(key in seg, f"snapshot segments lost {key!r}: {sorted(seg)}")
    check(tuple(seg["segment_pool_id"]) == tuple(pool.id), f"segment_pool_id {seg['segment_pool_id']} is not {pool.id}")
    states = {b["state"] for b in seg["blocks"] if b["address"] == x.data_ptr()}
    check(states == {"active_allocated"}, f"the live block's state is {states}")
    check(callable(getattr(torch._C, "_cuda_clearCublasWorkspaces", None)), "torch._C._cuda_clearCublasWorkspaces is gone")
    del x, pool


def test_out_of_memory_raises_and_changes_nothing():
    storage.release()
    before = storage.snapshot()
    total = torch.cuda.get_device_properties(DEV).total_memory
    error = None
    try:
        with storage.package():
            torch.empty(total + 16 * GiB, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        error = e
    after = storage.snapshot()
    check(error is not None, "no torch.OutOfMemoryError")
    message = storage.last_error()
    check("refused" in message and "CUDA_ERROR_OUT_OF_MEMORY" in message, message)
    check(any("vmmarena" in note for note in getattr(error, "__notes__", [])), "no vmmarena note on the error")
    for key in ("physical_bytes", "mapped_bytes"):
        check(after["totals"][key] == before["totals"][key], f"{key} changed")
    check(after["kinds"] == before["kinds"], "live or pooled memory changed")
    check(after["fatal_error"] is None, after["fatal_error"])
    with storage.package():
        ok = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda").fill_(7)
        check(int(ok[-1]) == 7, f"an allocation after the refusal reads back {int(ok[-1])}, not 7")
    print(f"  {message}")


def test_limit_stops_allocation_with_the_numbers():
    r = child("limit", {"VMMARENA_LIMIT": "4G"})
    print(f"  {r['count']} x 1 GiB held; {r['message']}")
    check(r["count"] == 4 and r["physical"] == 4 * GiB, r)
    check("limit 4.0 GiB < 4.0 GiB held + 1.0 GiB requested" in r["message"], r["message"])
    check(any("limit 4.0 GiB" in note for note in r["notes"]), r["notes"])
    check(r["limit_refusals"] >= 1, r)


def test_bad_configuration_is_an_error_not_a_default():
    r = child("bad_config", {"VMMARENA_LIMIT": "lots"})
    check(r["storage_error"] and 'VMMARENA_LIMIT="lots"' in r["storage_error"], r)
    check(r["oom"], "allocation with a bad configuration did not fail")
    check('VMMARENA_LIMIT="lots"' in r["last_error"], r["last_error"])


def test_use_as_default():
    try:
        vmmarena.use_as_default()
        raise AssertionError("use_as_default() accepted an initialized CUDA")
    except vmmarena.VmmarenaError as e:
        check("before CUDA is initialized" in str(e), str(e))
    r = child("default", {})
    check(r["close"] and r["package_live"] >= 2, r)
    check("already ran" in r["errors"][0] and "use_as_default('package')" in r["errors"][1], r["errors"])
    check(r["allocated"] == r["live_bytes"] > 0, "memory_allocated is not vmmarena's live bytes")
    check(r["fraction"] == 0.5 and r["limit"] == r["total"] // 2, "the memory fraction did not set the arena's limit")


def test_tags_label_segments():
    storage.release()
    with storage.package(), storage.tag("weights"):
        w = torch.empty(37 * MiB, dtype=torch.uint8, device="cuda")
    snap = storage.snapshot()
    tagged = containing(snap, w.data_ptr())
    check(tagged and tagged["tag"] == "weights", f"the tensor's mapping: {tagged}")
    check(any(t["tag"] == "weights" and t["bytes"] >= 38 * MiB for t in snap["tags"]), snap["tags"])
    del w


def test_docs_example_runs_as_written():
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../docs/torch.md")).read()
    example = text.split("## A worked example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=180)
    check(proc.returncode == 0, f"the example failed:\n{proc.stdout}\n{proc.stderr}")
    out = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())
    print(f"  {proc.stdout.strip()}".replace("\n", "; "))
    check(int(out["pool hits"]) > 0 and int(out["stray transient"]) == 0, out)
    check(int(out["after release MiB"]) < int(out["physical MiB"]), out)


def test_everything_is_released():
    global MODEL, X
    storage.release()
    torch.cuda.synchronize()
    held = storage.snapshot()["totals"]["physical_bytes"]  # MODEL and X
    free0 = torch.cuda.mem_get_info(DEV)[0]
    with storage.package():
        kept = matmul_product()
    with storage.retain_transient_backing():
        for _ in range(3):
            with storage.transient():
                MODEL(X)
                kept @ kept
    del kept
    storage.release()
    free1 = torch.cuda.mem_get_info(DEV)[0]
    now = storage.snapshot()["totals"]["physical_bytes"]
    check(now == held, f"{now} physical bytes after release, {held} before the workload")
    check(abs(free1 - free0) <= 2 * MiB, f"device free memory {free0} before the workload, {free1} after")
    MODEL = X = None
    storage.release()
    snap = storage.snapshot()
    free2 = torch.cuda.mem_get_info(DEV)[0]
    check(snap["totals"]["physical_bytes"] == 0 and snap["mappings"] == [], snap["mappings"])
    check(free2 + 2 * MiB >= free1 + held, f"{held} bytes released, device free {free1} -> {free2}")
    storage.check()


# In order: later tests use MODEL and X; the graph tests come late, as a fault there (an
# illegal address) would poison the process's CUDA context for every test after them.
TESTS = [
    test_matmul_matches_default_allocator,
    test_model_forward_matches_default_allocator,
    test_twelve_warmups_reuse_the_first_steps_mappings,
    test_without_reuse_or_retention_no_mapping_is_reused,
    test_reuse_on_another_stream_while_the_first_is_busy,
    test_reuse_after_pytorch_releases_a_pool_on_another_stream,
    test_snapshot_fields_the_benchmark_reads,
    test_out_of_memory_raises_and_changes_nothing,
    test_limit_stops_allocation_with_the_numbers,
    test_bad_configuration_is_an_error_not_a_default,
    test_use_as_default,
    test_tags_label_segments,
    test_docs_example_runs_as_written,
    test_graph_captured_in_a_step_replays_after_finish,
    test_graph_captured_into_the_package_pool,
    test_capture_in_a_step_returns_the_steps_cached_blocks,
    test_capture_in_a_step_reuses_the_steps_memory_under_retention,
    test_everything_is_released,
]
check_listed(TESTS, globals())


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(DEV)}, library {vmmarena.library_path()}")
    setup()
    return run("torch", TESTS)


if __name__ == "__main__":
    if is_child():
        torch.set_grad_enabled(False)
        child_main(CHILDREN)
    sys.exit(main())
