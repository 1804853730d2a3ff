"""GPU tests of vmmarena's native PyTorch allocator: vmmarena.install() registers the C++ class
of shim/torch_allocator (built here by vmmarena._process.build_native()) as PyTorch's CUDA
allocator. One test per row of the feature table of docs/torch.md (reduce-overhead, memory
history, catching out-of-memory, MemPool, sharing with another process, OOM observers), plus
the statistics, the checkpoints of cudagraph trees and the build's errors. Run by
tests/gpu/run; needs a CUDA GPU, torch 2.11, a C++ compiler, ninja, VMMARENA_LIBRARY and
PYTHONPATH=shim/python.

install() must come before CUDA is initialized, so this file runs in a process of its own and
installs at import. The native references come from child processes of this same file. Each
test checks first that vmmarena served what it tests (the backend's name, the arena's
inventory, calls counted), so none passes vacuously. Prints a line per test and
"native: N passed, M failed".
"""

import gc
import os
import pickle
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VMMARENA_LOG", "off")  # refusals are expected here; the tests read them
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
os.environ.setdefault("VMMARENA_NATIVE_CACHE", os.path.join(tempfile.gettempdir(), "vmmarena-native"))

import torch  # noqa: E402

import vmmarena  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_suite import (check, check_listed, child_main, containing, is_child, load_kernels, run,  # noqa: E402
                       spin_cycles)

CHILD = is_child()
BUILD_S = None
if not CHILD:
    t0 = time.time()
    vmmarena.install()  # before anything initializes CUDA; builds the class the first time
    BUILD_S = time.time() - t0

MiB, GiB = 1 << 20, 1 << 30
DEV = 0


def run_child(script, mode, *args, timeout=420):
    """gpu_suite.run_child with room for a cold torch.compile: `script --child mode args...`;
    returns its RESULT."""
    import json

    proc = subprocess.run([sys.executable, os.path.abspath(script), "--child", mode, *args], capture_output=True,
                          text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child {mode} {args} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def served(tensor, what):
    m = containing(vmmarena.snapshot(DEV), tensor.data_ptr())
    check(m is not None, f"{what} at 0x{tensor.data_ptr():x} is not in vmmarena's inventory")
    return m


def stream_waits():
    return vmmarena.snapshot(DEV)["driver"].get("cuStreamWaitEvent", {}).get("calls", 0)


def usage():
    return vmmarena._lib.usage(DEV)


# ---- Workloads, the same in this process and in the native children --------------------------


def compile_workload():
    """A small model under torch.compile(mode="reduce-overhead"): inference on three shapes, then
    training steps (forward and backward graphs). Returns (outputs, final weights, peak bytes
    reserved during the run above what was reserved before it)."""
    torch.manual_seed(0)
    width = 1024
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width),
                                torch.nn.LayerNorm(width)).cuda()
    g = torch.Generator().manual_seed(1)
    inputs = {rows: [torch.randn(rows, width, generator=g).cuda() for _ in range(3)] for rows in (512, 768, 1024)}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    outs = []
    infer = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        # Each round is one generation: the first calls warm up, the next record, then replay;
        # a shape first seen after a replay (1024 rows) makes the trees restore a checkpoint.
        for step, shapes in enumerate([(512, 768)] * 3 + [(512, 1024)] * 3):
            torch.compiler.cudagraph_mark_step_begin()
            for rows in shapes:
                outs.append(infer(inputs[rows][step % 3]).clone())
    train = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        loss = train(inputs[512][step % 3]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        outs.append(loss.detach().clone())
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved() - base
    weights = [p.detach().cpu() for p in model.parameters()]
    return [o.cpu() for o in outs], weights, peak


def child_native_compile(path):
    outs, weights, peak = compile_workload()
    torch.save({"outs": outs, "weights": weights}, path)
    return {"peak": peak}


def child_native_keys():
    x = torch.empty(MiB, device="cuda")
    keys = sorted(torch.cuda.memory_stats())
    del x
    return {"keys": keys}


def child_install(env_cxx, cache, fake_version):
    """install() in a fresh process with CXX, the cache directory and torch's version as given."""
    if env_cxx:
        os.environ["CXX"] = env_cxx
    os.environ["VMMARENA_NATIVE_CACHE"] = cache
    if fake_version:
        torch.__version__ = fake_version
    t0 = time.time()
    try:
        vmmarena.install()
    except vmmarena.VmmarenaError as e:
        return {"error": str(e), "installed": vmmarena.installed()}
    x = torch.ones(MiB, device="cuda")
    return {"error": None, "installed": vmmarena.installed(), "backend": torch.cuda.memory.get_allocator_backend(),
            "sum": float(x.sum()), "seconds": time.time() - t0}


CHILDREN = {"native_compile": child_native_compile, "native_keys": child_native_keys, "install": child_install}


# ---- Tests ----------------------------------------------------------------------------------


def test_install_registers_vmmarena_everywhere_pytorch_looks():
    check(vmmarena.installed(), "not installed")
    backend = torch.cuda.memory.get_allocator_backend()
    check(backend == "vmmarena", f"PyTorch's CUDA allocator is {backend!r}")
    check(vmmarena._process._allocator.installed(), "the module says PyTorch's allocator is not vmmarena's")
    before = usage()["alloc_count"]
    x = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
    served(x, "a plain tensor")
    check(usage()["alloc_count"] == before + 1, "the tensor did not come from the arena")
    # torch.accelerator asks the device allocator registry (c10::GetAllocator), not the CUDA pointer
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated"):
        check(torch.accelerator.memory_allocated() == torch.cuda.memory_allocated(),
              (torch.accelerator.memory_allocated(), torch.cuda.memory_allocated()))
        check(torch.accelerator.memory_stats()["allocation.all.current"] ==
              torch.cuda.memory_stats()["allocation.all.current"], "torch.accelerator's statistics differ")
    print(f"  backend {backend}; the class built and installed in {BUILD_S:.1f} s")
    del x


def test_statistics_are_pytorchs_keys_and_agree_with_the_snapshot():
    native = run_child(__file__, "native_keys")["keys"]
    torch.cuda.synchronize()
    x = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")
    small = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (100, 4096, 70_000)]
    stats = torch.cuda.memory_stats()
    check(sorted(stats) == native, f"keys differ from native: {sorted(set(native) ^ set(stats))}")
    u = usage()
    check(stats["allocated_bytes.all.current"] == u["allocated_bytes"], (stats["allocated_bytes.all.current"], u))
    check(stats["reserved_bytes.all.current"] == u["reserved_bytes"], (stats["reserved_bytes.all.current"], u))
    check(stats["requested_bytes.all.current"] >= 96 * MiB + 74_196, stats["requested_bytes.all.current"])
    check(stats["allocation.small_pool.current"] >= 3, stats["allocation.small_pool.current"])
    snap = torch.cuda.memory_snapshot()
    allocated = sum(b["size"] for s in snap for b in s["blocks"] if b["state"] == "active_allocated")
    check(allocated == stats["allocated_bytes.all.current"],
          f"memory_snapshot() holds {allocated} allocated bytes, memory_stats() {stats['allocated_bytes.all.current']}")
    check(len(snap) == stats["segment.all.current"], (len(snap), stats["segment.all.current"]))
    check(sum(s["total_size"] for s in snap) <= stats["reserved_bytes.all.current"], "segments beyond reserved")
    for s in snap:
        check(sum(b["size"] for b in s["blocks"]) == s["total_size"], f"blocks do not tile segment {s['address']:x}")
    blocks = {b["address"]: b for s in snap for b in s["blocks"]}
    check(blocks[x.data_ptr()]["state"] == "active_allocated" and blocks[x.data_ptr()]["requested_size"] == 96 * MiB,
          blocks.get(x.data_ptr()))
    check("Allocated memory" in torch.cuda.memory_summary(), "memory_summary() failed")
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    stats = torch.cuda.memory_stats()
    check(stats["allocation.all.allocated"] == 0 and stats["allocated_bytes.all.peak"] == stats[
        "allocated_bytes.all.current"], "the resets did not reset")
    del x, small


def test_reduce_overhead_compile_equals_native_with_no_higher_peak():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "native.pt")
        native_peak = run_child(__file__, "native_compile", path)["peak"]
        ref = torch.load(path)
    counts = {"get": 0, "set": 0}
    real_get, real_set = torch._C._cuda_getCheckpointState, torch._C._cuda_setCheckpointPoolState

    def get(*args):
        counts["get"] += 1
        return real_get(*args)

    def set_(*args):
        counts["set"] += 1
        return real_set(*args)

    torch._C._cuda_getCheckpointState, torch._C._cuda_setCheckpointPoolState = get, set_
    try:
        outs, weights, peak = compile_workload()
        pools = {m["pool"] for m in vmmarena.snapshot(DEV)["mappings"]} - {0}
    finally:
        torch._C._cuda_getCheckpointState, torch._C._cuda_setCheckpointPoolState = real_get, real_set
    check(counts["get"] > 0, "cudagraph trees took no checkpoint of vmmarena's pool: no CUDA graph was recorded")
    check(pools, "no memory of a graph pool in the arena: the graphs' memory did not come from vmmarena")
    equal = all(torch.equal(a, b) for a, b in zip(outs + weights, ref["outs"] + ref["weights"]))
    worst = max(float((a - b).abs().max()) for a, b in zip(outs + weights, ref["outs"] + ref["weights"]))
    check(len(outs) == len(ref["outs"]), (len(outs), len(ref["outs"])))
    check(worst <= 1e-5, f"results differ from native by up to {worst:g}")
    print(f"  {len(outs)} outputs {'bitwise equal to' if equal else f'within {worst:g} of'} native; checkpoints "
          f"taken {counts['get']}, restored {counts['set']}; peak reserved {peak / MiB:.1f} MiB, native "
          f"{native_peak / MiB:.1f} MiB")
    check(peak <= native_peak, f"peak {peak} bytes above native's {native_peak}")
    torch._dynamo.reset()
    gc.collect()


def test_checkpoint_state_holds_and_restores_a_pools_allocations():
    # What cudagraph trees do between paths, through the same bindings.
    pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    keeper = torch.cuda.CUDAGraph()  # keeps the pool alive, as the trees' first empty graph does
    with torch.cuda.graph(keeper, pool=pool, stream=stream):
        a = torch.full((MiB,), 1.0, device="cuda")
        b = torch.full((MiB // 4,), 2.0, device="cuda")
    keeper.replay()  # a capture records the fills; the replay runs them
    torch.cuda.synchronize()
    a_ptr, b_ptr, a_bytes = a.data_ptr(), b.data_ptr(), a.untyped_storage().nbytes()
    check(served(a, "a graph's tensor")["pool"] != 0, "the capture's memory is not in a pool")
    state = torch._C._cuda_getCheckpointState(DEV, pool)
    check(torch._C._cuda_checkPoolLiveAllocations(DEV, pool, {a_ptr, b_ptr}), "the pool's live set is not {a, b}")
    a_storage = a.untyped_storage()
    torch._C._free_And_Remove_DeleterFn(a_storage._cdata)  # a path ends: a's memory is freed, the storage stays
    check(torch._C._cuda_checkPoolLiveAllocations(DEV, pool, {b_ptr}), "a is still live in the pool")
    torch._C._cuda_beginAllocateCurrentThreadToPool(DEV, pool)
    try:
        c = torch.empty(MiB, device="cuda")
    finally:
        torch._C._cuda_endAllocateToPool(DEV, pool)
        torch._C._cuda_releasePool(DEV, pool)
    check(c.data_ptr() != a_ptr, "a new allocation of the pool got the memory the checkpoint holds")
    check(torch._C._cuda_checkPoolLiveAllocations(DEV, pool, {b_ptr, c.data_ptr()}), "the pool's live set is not {b, c}")
    revived = torch._C._construct_storage_from_data_pointer(a_ptr, a.device, a_bytes)
    torch._C._cuda_setCheckpointPoolState(DEV, state, [c.untyped_storage()._cdata], [revived._cdata])
    check(torch._C._cuda_checkPoolLiveAllocations(DEV, pool, {a_ptr, b_ptr}), "the restore did not bring a back")
    check(torch._C._has_Standard_Deleter(revived._cdata), "the revived storage lacks vmmarena's deleter")
    again = torch.empty(0, device="cuda").set_(revived).view(MiB)
    check(bool((again == 1.0).all()), "the revived allocation lost its contents")
    del again, revived, c, a, a_storage, b, state, keeper
    gc.collect()


def test_memory_history_snapshot_reads_in_memory_viz():
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        x = torch.empty(3 * MiB + 4, dtype=torch.uint8, device="cuda")
        small = torch.empty(1000, device="cuda")
        y = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        y_ptr = y.data_ptr()
        del y
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap["device_traces"][DEV]
    allocs = {e["addr"]: e for e in traces if e["action"] == "alloc"}
    check(x.data_ptr() in allocs and allocs[x.data_ptr()]["size"] == 3 * MiB + 4, "x's allocation is not in the trace")
    frames = allocs[x.data_ptr()].get("frames", [])
    check(any("test_memory_history" in f["name"] for f in frames), f"x's frames do not name this test: {frames[:3]}")
    check(any(e["action"] == "free_completed" and e["addr"] == y_ptr for e in traces), "y's free is not in the trace")
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    for t, size in ((x, 3 * MiB + 4), (small, 4000)):
        block = blocks.get(t.data_ptr())
        check(block and block["state"] == "active_allocated" and block["requested_size"] == size, block)
        check(block.get("frames"), f"the block at 0x{t.data_ptr():x} has no frames")
    from torch.cuda import _memory_viz as viz

    for kind, render in (("trace_plot", viz.trace_plot), ("segment_plot", viz.segment_plot),
                         ("trace_plot_segments", lambda d: viz.trace_plot(d, plot_segments=True))):
        html = render(snap)
        check("add_local_files" in html and len(html) > 10_000, f"{kind}: the HTML does not embed the snapshot")
    summary = viz.segsum(snap)  # asserts that every segment's blocks add up
    check(f"segments: {len(snap['segments'])}" in summary, summary[-300:])
    viz.trace(snap)
    viz.memory(snap, format_flamegraph=lambda text: text)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snapshot.pickle")
        with open(path, "wb") as f:
            pickle.dump(snap, f)
        out = os.path.join(d, "trace.html")
        subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", path, "-o", out], check=True)
        check(os.path.getsize(out) > 10_000, "memory_viz's command wrote nothing")
    print(f"  {len(traces)} trace entries, {len(snap['segments'])} segments; memory_viz rendered them")
    del x, small


def test_out_of_memory_is_pytorchs_and_the_program_carries_on():
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(DEV).total_memory
    ooms = torch.cuda.memory_stats()["num_ooms"]
    messages = {}
    for label, size in (("past the card", total + 16 * GiB), ("past the address space", 1 << 50),
                        ("past an exabyte", 1 << 61)):
        try:
            torch.empty(size, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            messages[label] = str(e)
    check(len(messages) == 3, f"not every refusal was a torch.cuda.OutOfMemoryError: {sorted(messages)}")
    card = messages["past the card"]
    check(card.startswith("CUDA out of memory. Tried to allocate ") and f"GPU {DEV} has a total capacity of" in card,
          card)
    check(f"vmmarena refused {total + 16 * GiB} bytes" in card, card)
    check("CUDA out of memory." in messages["past the address space"], messages["past the address space"])
    check("Tried to allocate more than 1EB memory" in messages["past an exabyte"], messages["past an exabyte"])
    check(torch.cuda.memory_stats()["num_ooms"] > ooms, "num_ooms did not count the refusals")
    ok = torch.ones(64 * MiB, dtype=torch.uint8, device="cuda")
    check(int(ok.sum()) == 64 * MiB, "an allocation after the refusals reads back wrong")
    print(f"  {card[:160]}...")


def test_out_of_memory_observers_are_called():
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    size = torch.cuda.get_device_properties(DEV).total_memory + 8 * GiB
    try:
        torch.empty(size, dtype=torch.uint8, device="cuda")
        raise AssertionError("no error for a request larger than the card")
    except torch.cuda.OutOfMemoryError:
        pass
    check(len(seen) == 1, f"the observer was called {len(seen)} times")
    device, alloc, device_total, device_free = seen[0]
    check((device, alloc) == (DEV, size), seen[0])
    check(0 < device_free <= device_total, seen[0])


def test_mempool_memory_is_kept_apart():
    n = 48 * MiB
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pool = torch.cuda.MemPool()
    check(pool.use_count() == 1, f"a new MemPool has {pool.use_count()} uses")
    with torch.cuda.use_mem_pool(pool):
        check(pool.use_count() == 2, f"inside use_mem_pool: {pool.use_count()} uses")
        x = torch.full((n,), 5, dtype=torch.uint8, device="cuda")
    check(served(x, "a MemPool tensor")["pool"] != 0, "the MemPool's tensor is in the shared cache")
    x_ptr = x.data_ptr()
    segments = pool.snapshot()
    check(segments and all(tuple(s["segment_pool_id"]) == tuple(pool.id) for s in segments),
          f"pool.snapshot(): {[s['segment_pool_id'] for s in segments]}")
    check(any(b["address"] == x_ptr for s in segments for b in s["blocks"]), "pool.snapshot() lacks the tensor")
    del x
    eager = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(eager.data_ptr() != x_ptr, "eager work got the memory of a live MemPool")
    with torch.cuda.use_mem_pool(pool):
        again = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(again.data_ptr() == x_ptr, "the MemPool did not get its own memory back")
    del again
    reserved = torch.cuda.memory_reserved()
    del pool
    gc.collect()
    later = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(torch.cuda.memory_reserved() <= reserved, "the released MemPool's memory did not join the cache")
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(vmmarena.library_path(), "vmm_torch_package_allocate",
                                                         "vmm_torch_free")
    try:
        torch.cuda.MemPool(allocator=pluggable.allocator())
        raise AssertionError("MemPool(allocator=...) was accepted")
    except RuntimeError as e:
        check("vmmarena" in str(e) and "MemPool(allocator=" in str(e), str(e))
    del eager, later


def test_record_stream_leaves_the_other_streams_work_unwaited():
    """A tensor used on stream S (a kernel still sleeping there) and freed with record_stream(S)
    is not handed to a request on the current stream, and that stream is not made to wait for
    S: a kernel queued on it after the request finishes while S still sleeps. Once S is done,
    the memory comes back."""
    n = 32 * MiB
    side = torch.cuda.Stream()
    cycles = spin_cycles(1000)  # about a second
    load_kernels(side, torch.cuda.current_stream())  # no lazy module load behind the spin
    x = torch.ones(n, dtype=torch.uint8, device="cuda")
    served(x, "the tensor used on the side stream")
    x_ptr = x.data_ptr()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(1)
    x.record_stream(side)
    del x
    check(not side.query(), "the side stream finished before the request: nothing to test")
    waits = stream_waits()
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(y.data_ptr() != x_ptr, "memory still used on the side stream was handed to the current stream")
    y.fill_(7)
    done = torch.cuda.Event()
    done.record()
    deadline = time.time() + 0.5
    while not done.query() and time.time() < deadline:
        time.sleep(0.001)
    check(done.query(), "the current stream's work waited for the side stream's (record_stream made it wait)")
    check(not side.query(), "the side stream finished within 0.5 s: the check above proves nothing")
    side.synchronize()
    del y
    z = torch.empty(n, dtype=torch.uint8, device="cuda")
    served(z, "the request after the side stream finished")
    later = stream_waits()
    check(later == waits, f"the requests made {later - waits} stream wait(s) (cuStreamWaitEvent)")
    print(f"  the current stream ran on while the side stream slept; reuse after it finished: "
          f"{'same address' if z.data_ptr() == x_ptr else 'other cached memory'}")
    del z


def test_a_wait_stream_lets_the_side_stream_reuse_pending_frees():
    """Freed on the current stream while a kernel still sleeps there, a tensor's memory serves the
    side stream at once after side.wait_stream(current) (the program's own order), with no new
    memory and no stream wait of vmmarena's; without that wait, it does not."""
    n = 32 * MiB
    current, side, other = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()
    cycles = spin_cycles(1000)  # about a second
    load_kernels(side, other, current)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    x = torch.ones(n, dtype=torch.uint8, device="cuda")
    x_ptr = x.data_ptr()
    del x  # freed on the current stream, its work still queued behind the sleep
    with torch.cuda.stream(other):  # not ordered after the free: other memory
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(y.data_ptr() != x_ptr, "a pending free served a stream the program never ordered after it")
    before, waits = usage(), stream_waits()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
        z.fill_(3)
    check(not current.query(), "the current stream finished before the request: nothing to test")
    check(z.data_ptr() == x_ptr, f"the side stream, after wait_stream, got 0x{z.data_ptr():x}, not the freed 0x{x_ptr:x}")
    check(usage()["reserved_bytes"] == before["reserved_bytes"], "new memory for a request the pending free could serve")
    check(stream_waits() == waits, "vmmarena made a stream wait where the program had ordered it already")
    torch.cuda.synchronize()
    check(int(z.sum().item()) == 3 * n, "the side stream's data is wrong")
    print("  the side stream reused the pending free after wait_stream, no new memory, no wait added")
    del y, z


def _fd_count():
    return len(os.listdir("/proc/self/fd"))


def _ipc_receiver():
    """A spawned child that runs vmmarena.install() and reads what it is sent."""
    import torch.multiprocessing as mp

    import vmmarena_ipc_child

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=vmmarena_ipc_child.receive, args=(inbox, outbox))
    child.start()
    ready = outbox.get(timeout=240)
    check(ready[0] == "ready" and ready[1] == "vmmarena" and ready[2], f"the child did not run under vmmarena: {ready}")
    return child, inbox, outbox


def _ipc_stop(child, inbox, outbox):
    inbox.put(None)
    done = outbox.get(timeout=120)
    child.join(timeout=60)
    check(done[0] == "done" and child.exitcode == 0, f"the child ended with {done}, exit code {child.exitcode}")


def test_a_tensor_is_shared_with_a_child_process_under_vmmarena():
    child, inbox, outbox = _ipc_receiver()
    try:
        # a whole mapping, an assembled one (after frees of smaller ones) and a page slot
        for size, tag in ((6 * MiB, "whole"), (3 * MiB + 4096, "other"), (4096, "slot")):
            x = torch.arange(size // 4, device="cuda", dtype=torch.float32).mul_(0.5).add_(1.0)
            served(x, tag)
            want = float(x.double().sum())
            inbox.put((tag, x))
            got = outbox.get(timeout=120)
            check(got[0] == tag and got[3] is None and got[1] == want, f"{tag}: sent sum {want}, child read {got}")
            del x
        ys = [torch.ones(MiB, device="cuda") for _ in range(4)]
        del ys[1], ys[2]
        y = torch.full((4 * MiB // 4 * 2,), 3.0, device="cuda")  # 8 MiB: may be stitched from the freed ones
        inbox.put(("stitched", y))
        got = outbox.get(timeout=120)
        check(got[3] is None and got[1] == float(y.double().sum()), f"stitched: child read {got}")
        del y, ys
        torch.cuda.synchronize()
        print("  a child under vmmarena read 4 shared tensors, checksums equal")
    finally:
        _ipc_stop(child, inbox, outbox)


def test_thousands_of_shares_leave_the_descriptor_count():
    child, inbox, outbox = _ipc_receiver()
    try:
        x = torch.ones(2 * MiB, device="cuda")
        inbox.put(("warm", x))
        outbox.get(timeout=120)
        del x
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()
        before = _fd_count()
        child_before = None
        sizes = (4096, 2 * MiB, 6 * MiB, 64 << 10)
        n = 2000
        t0 = time.time()
        for i in range(n):
            t = torch.full((sizes[i % 4] // 4,), float(i % 7), device="cuda")
            inbox.put(("n", t))
            got = outbox.get(timeout=120)
            check(got[3] is None and got[1] == float(i % 7) * (sizes[i % 4] // 4), f"share {i}: {got}")
            if child_before is None:
                child_before = got[2]
            del t
        seconds = time.time() - t0
        child_after = got[2]
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()  # the handles go back to the driver: their descriptors close
        after = _fd_count()
        check(after == before, f"the parent had {before} descriptors before {n} shares and {after} after")
        check(child_after <= child_before + 2, f"the child had {child_before} descriptors, then {child_after}")
        print(f"  {n} shares in {seconds:.1f} s; parent descriptors {before} -> {after}, "
              f"child {child_before} -> {child_after}")
    finally:
        _ipc_stop(child, inbox, outbox)


def test_a_forged_or_stale_handle_is_refused_clearly():
    import ctypes
    import struct

    lib = ctypes.CDLL(vmmarena.library_path())
    lib.vmm_torch_ipc_open.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.c_char_p, ctypes.c_size_t]
    x = torch.ones(2 * MiB, device="cuda")
    shared = x.untyped_storage()._share_cuda_()
    handle = shared[1]
    check(handle[:4] == b"VMMA", f"not vmmarena's handle: {handle[:8]!r}")
    before = _fd_count()

    def refused(h, says):
        base = ctypes.c_void_p()
        msg = ctypes.create_string_buffer(2048)
        st = lib.vmm_torch_ipc_open(h, len(h), DEV, ctypes.byref(base), msg, len(msg))
        text = msg.value.decode()
        check(st != 0 and not base.value and says in text, f"status {st}, base {base.value}: {text!r}")
        return text

    def sealed(body):  # a forged handle with a valid checksum
        h = 1469598103934665603
        for b in body:
            h = ((h ^ b) * 1099511628211) & (2**64 - 1)
        return body + struct.pack("<Q", h)

    body = bytearray(handle[:-8])
    refused(b"\x02eNOT-OURS", "not a CUDA IPC handle of vmmarena")
    refused(bytes(body) + b"\0" * 8, "checksum")
    devnull = os.open("/dev/null", os.O_RDONLY)
    forged = bytearray(body)
    struct.pack_into("<i", forged, 40, devnull)  # the first piece's descriptor: not a CUDA one
    refused(sealed(bytes(forged)), "not a handle this process can import")
    struct.pack_into("<i", forged, 40, 4000)  # a descriptor the sender does not have
    refused(sealed(bytes(forged)), "cannot be taken")
    os.close(devnull)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = bytearray(body)
    struct.pack_into("<I", dead, 8, gone.pid)
    refused(sealed(bytes(dead)), "has exited")
    # through PyTorch: the same refusal as a RuntimeError of vmmarena (no event: an IPC event
    # cannot be opened in the process that made it)
    try:
        torch.UntypedStorage._new_shared_cuda(shared[0], sealed(bytes(forged)), *shared[2:7], False)
        raise AssertionError("a forged handle was opened")
    except RuntimeError as e:
        check("vmmarena" in str(e) and "cannot be taken" in str(e), str(e))
    check(_fd_count() == before, f"descriptors {before} before the refusals, {_fd_count()} after")
    check(int(x.sum()) == 2 * MiB, "the tensor changed")
    print("  forged, foreign, unknown-descriptor and exited-sender handles refused; no descriptor left open")


def test_a_missing_compiler_or_another_pytorch_is_one_clear_line():
    with tempfile.TemporaryDirectory() as empty:
        r = run_child(__file__, "install", "/nonexistent/c++", empty, "")
        check(r["error"] and "C++ compiler" in r["error"] and "\n" not in r["error"] and not r["installed"], r)
        r = run_child(__file__, "install", "", empty, "2.99.0")
        check(r["error"] and "PyTorch 2.99.0" in r["error"] and "2.11" in r["error"] and not r["installed"], r)
    # Built once (by this process): a fresh process loads the cached build, no compiler needed.
    r = run_child(__file__, "install", "/nonexistent/c++", os.environ["VMMARENA_NATIVE_CACHE"], "")
    check(r["error"] is None and r["backend"] == "vmmarena" and r["sum"] == MiB, r)
    print(f"  a fresh process installed from the cache in {r['seconds']:.1f} s without a compiler")


TESTS = [
    test_install_registers_vmmarena_everywhere_pytorch_looks,
    test_reduce_overhead_compile_equals_native_with_no_higher_peak,
    test_statistics_are_pytorchs_keys_and_agree_with_the_snapshot,
    test_checkpoint_state_holds_and_restores_a_pools_allocations,
    test_memory_history_snapshot_reads_in_memory_viz,
    test_out_of_memory_is_pytorchs_and_the_program_carries_on,
    test_out_of_memory_observers_are_called,
    test_mempool_memory_is_kept_apart,
    test_record_stream_leaves_the_other_streams_work_unwaited,
    test_a_wait_stream_lets_the_side_stream_reuse_pending_frees,
    test_a_tensor_is_shared_with_a_child_process_under_vmmarena,
    test_thousands_of_shares_leave_the_descriptor_count,
    test_a_forged_or_stale_handle_is_refused_clearly,
    test_a_missing_compiler_or_another_pytorch_is_one_clear_line,
]
check_listed(TESTS, globals())


def main():
    """Runs every test, or those named on the command line."""
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(DEV)}, library {vmmarena.library_path()}")
    chosen = [t for t in TESTS if t.__name__ in sys.argv[1:]] if len(sys.argv) > 1 else TESTS
    return run("native", chosen)


if __name__ == "__main__":
    if CHILD:
        child_main(CHILDREN)
    sys.exit(main())
