"""GPU tests of whole-process mode: vmmarena.install() makes vmmarena PyTorch's allocator for
every tensor (run by tests/gpu/run; needs a CUDA GPU, torch, VMMARENA_LIBRARY and
PYTHONPATH=shim/python).

install() must come before CUDA is initialized, so this file runs in a process of its own and
installs at import. The native references (PyTorch's own allocator) come from a child process
of this same file. Each test checks its precondition first (vmmarena served the tensor, the
memory was really reused, the other stream was really still busy), so none passes vacuously.
Prints a line per test and "process: N passed, M failed".
"""

import gc
import os
import sys
import tempfile

os.environ.setdefault("VMMARENA_LOG", "off")  # refusals are expected here; the tests read them
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402

import vmmarena  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_suite import (check, check_listed, child_main, containing, is_child, load_kernels,  # noqa: E402
                       run, run_child, spin_cycles)

CHILD = is_child()
if not CHILD:
    vmmarena.install()  # before anything initializes CUDA

MiB, GiB = 1 << 20, 1 << 30
DEV = 0
SPIN_MS = 1500  # a busy stream's spin: far longer than the host's free and reuse take


def served(tensor, what):
    m = containing(vmmarena.snapshot(DEV), tensor.data_ptr())
    check(m is not None, f"{what} at 0x{tensor.data_ptr():x} is not in vmmarena's inventory")
    return m


def usage():
    return vmmarena._lib.usage(DEV)


# ---- The workload, the same in this process and in the native child ---------------------


def build_model(seed=1):
    torch.manual_seed(seed)
    width = 512
    return torch.nn.Sequential(
        torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
        torch.nn.Linear(4 * width, width), torch.nn.LayerNorm(width), torch.nn.Linear(width, width),
    ).eval().cuda()


def make_input(seed, batch=64, seq=128):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, 512, generator=g).cuda()


def deterministic():
    torch.use_deterministic_algorithms(True)
    # torch.empty would otherwise launch a fill kernel, which the stream tests do not expect.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.benchmark = False
    torch.set_grad_enabled(False)


def child_native(path):
    """The references on PyTorch's own allocator."""
    deterministic()
    model = build_model()
    outs = {f"x{seed}": model(make_input(seed)).cpu() for seed in (3, 4)}
    torch.save(outs, path)
    return {"saved": path}


def child_install_late():
    torch.cuda.init()
    try:
        vmmarena.install()
    except vmmarena.VmmarenaError as e:
        return {"error": str(e), "installed": vmmarena.installed()}
    return {"error": None, "installed": vmmarena.installed()}


CHILDREN = {"native": child_native, "install_late": child_install_late}


# ---- Tests ----------------------------------------------------------------------------------


def test_install_before_cuda_only():
    vmmarena.install()  # again: a no-op
    check(vmmarena.installed(), "not installed")
    backend = torch.cuda.memory.get_allocator_backend()
    check(backend == "vmmarena", f"PyTorch's allocator backend is {backend!r}, not vmmarena's native allocator")
    r = run_child(__file__, "install_late")
    check(r["error"] and "before CUDA is initialized" in r["error"] and not r["installed"], r)


def test_forward_bitwise_equal_to_native():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "native.pt")
        run_child(__file__, "native", path)
        ref = torch.load(path)
    storage = vmmarena.Storage(DEV)
    with storage.package():
        model = build_model()
    weights = served(model[1].weight, "a weight")
    check(weights["kind"] == "package", f"weights built in package() are {weights['kind']}")
    for seed in (3, 4):
        x = make_input(seed)
        out = model(x)
        served(out, "the forward's output")
        check(torch.equal(out.cpu(), ref[f"x{seed}"]),
              f"input {seed}: differs from native (max abs diff {(out.cpu() - ref[f'x{seed}']).abs().max().item():g})")


def test_graph_replay_unchanged_after_eager_churn():
    model, static_x = build_model(2), make_input(5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(static_x)  # warm-up on a side stream, as capture needs
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
    g.replay()
    torch.cuda.synchronize()
    first = static_y.clone()
    inputs = [make_input(100 + k) for k in range(7)]
    before = usage()
    seen, repeats, churned = set(), 0, 0
    for i in range(300):  # eager tensors of the graph's sizes and others, filled with garbage
        for shape in ((64, 128, 2048), (64, 128, 512), (1000 + 37 * (i % 50),), (3, 5)):
            t = torch.full(shape, float("nan"), device="cuda")
            repeats += t.data_ptr() in seen
            seen.add(t.data_ptr())
            churned += t.numel() * 4
            del t
        model(inputs[i % 7])
    torch.cuda.synchronize()
    grown = usage()["reserved_bytes"] - before["reserved_bytes"]
    check(repeats > 100, f"the churn reused memory only {repeats} times: nothing was tested")
    check(grown < churned // 10, f"the churn grew the arena by {grown} of {churned} bytes: no reuse")
    g.replay()
    torch.cuda.synchronize()
    check(torch.equal(static_y, first), "the graph's replay changed after eager churn")
    del g


def _kept_from_the_main_stream_while_busy(free_stream_setup, label):
    """A tensor used on busy stream S is freed; the next same-size allocation on the main
    stream must not get its memory while S's work is queued, nor make the main stream wait for
    S (as PyTorch's allocator promises)."""
    n = 64 * MiB
    s = torch.cuda.Stream()
    cycles = spin_cycles(SPIN_MS)
    load_kernels(s, torch.cuda.current_stream())
    torch.cuda.empty_cache()  # no other cached mapping of this size to hand the main stream
    done = torch.cuda.Event()
    x, fill_on_s = free_stream_setup(s, n)
    ptr = x.data_ptr()
    with torch.cuda.stream(s):
        torch.cuda._sleep(cycles)
        fill_on_s(x)
        done.record(s)
    del x
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    y.fill_(2)
    main_done = torch.cuda.Event()
    main_done.record()
    main_done.synchronize()
    busy = not done.query()
    check(busy, f"{label}: stream S had finished when the main stream's work did: the main stream waited for S "
                "(or S's spin was too short to tell)")
    check(y.data_ptr() != ptr, f"{label}: the main stream got memory stream S was still using")
    torch.cuda.synchronize()
    check(bool((y == 2).all()), f"{label}: the main stream's fill was overwritten")
    del y
    z = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(containing(vmmarena.snapshot(DEV), z.data_ptr()) is not None,
          f"{label}: the request after S finished is not in vmmarena's inventory")
    del z


def test_record_stream_keeps_memory_until_the_stream_is_done():
    def setup(s, n):
        x = torch.empty(n, dtype=torch.uint8, device="cuda")  # allocated on the main stream
        x.record_stream(s)
        return x, lambda t: t.fill_(1)

    _kept_from_the_main_stream_while_busy(setup, "record_stream")


def test_a_side_stream_free_serves_main_only_once_done():
    def setup(s, n):
        with torch.cuda.stream(s):
            x = torch.empty(n, dtype=torch.uint8, device="cuda")  # allocated (and freed) on S
        return x, lambda t: t.fill_(1)

    _kept_from_the_main_stream_while_busy(setup, "side-stream free")


def test_out_of_memory_raises_and_recovers():
    torch.cuda.synchronize()
    before, ooms = usage(), torch.cuda.memory_stats()["num_ooms"]
    total = torch.cuda.get_device_properties(DEV).total_memory
    error = None
    try:
        torch.empty(total + 16 * GiB, dtype=torch.uint8, device="cuda")
    except (torch.OutOfMemoryError, RuntimeError) as e:
        error = str(e)
    check(error is not None, "no error for a request larger than the card")
    check("out of memory" in error.lower(), error)
    check("vmmarena refused" in error and str(total + 16 * GiB) in error, error)
    after = usage()
    check(after["refusals"] == before["refusals"] + 1, (before["refusals"], after["refusals"]))
    check(torch.cuda.memory_stats()["num_ooms"] == ooms + 1, "num_ooms did not count the refusal")
    check(after["allocated_bytes"] == before["allocated_bytes"], "the refusal changed what is allocated")
    ok = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda").fill_(7)
    check(int(ok[-1]) == 7 and int(ok.sum()) == 7 * 64 * MiB, "an allocation after the refusal reads back wrong")
    print(f"  {error[:300]}")


def test_memory_fraction_caps_new_memory():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info(DEV)[1]
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # PyTorch 2.9 on
    check(getter is None or getter(DEV) == 1.0, "a fraction under 1 before any was set")
    fraction = (torch.cuda.memory_reserved() + 256 * MiB) / total
    torch.cuda.set_per_process_memory_fraction(fraction, DEV)
    try:
        check(vmmarena.snapshot(DEV)["limit_bytes"] == int(fraction * total), "the arena's limit is not the fraction's")
        check(getter is None or abs(getter(DEV) - fraction) < 1e-9, "get_per_process_memory_fraction differs")
        fits = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda").fill_(3)
        error = None
        try:
            torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        except (torch.OutOfMemoryError, RuntimeError) as e:
            error = str(e)
        check(error is not None, "a request past the fraction's limit was served")
        check("out of memory" in error.lower() and "limit" in error, error)
        print(f"  {error[:300]}")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, DEV)
    check(vmmarena.snapshot(DEV)["limit_bytes"] == total, "a fraction of 1 is not the device's memory")
    # Read back once the limit is lifted: sum() of uint8 makes an int64 copy, 8 times the tensor.
    check(int(fits.sum()) == 3 * 128 * MiB, "the tensor under the limit reads back wrong")
    del fits
    after = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda").fill_(1)
    check(int(after[-1]) == 1, "an allocation after the limit was lifted reads back wrong")


def test_empty_cache_returns_memory_to_the_driver():
    torch.cuda.synchronize()
    held = [torch.empty(512 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    for t in held:
        t.fill_(1)
    del held, t
    torch.cuda.synchronize()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    free_before = torch.cuda.mem_get_info(DEV)[0]
    check(cached >= 4 * GiB, f"only {cached} bytes cached after freeing 4 GiB: nothing to give back")
    torch.cuda.empty_cache()
    free_after = torch.cuda.mem_get_info(DEV)[0]
    print(f"  cached {cached / GiB:.2f} GiB; device free {free_before / GiB:.2f} -> {free_after / GiB:.2f} GiB")
    check(free_after - free_before >= 4 * GiB - 64 * MiB, f"empty_cache gave back {free_after - free_before} bytes")
    left = usage()
    # What stays cached is the free room of pages that still hold a live slot.
    check(left["cached_bytes"] <= left["pages"] * 2 * MiB,
          f"{left['cached_bytes']} bytes still cached with {left['pages']} page(s) carved")


def test_empty_cache_waits_for_background_unmaps():
    # Three 2 MiB tensors stitched into a 6 MiB one retire two ranges each (one of the three is
    # grown in place where VMMARENA_GROW is on, the default); past 256 kept, the oldest go to the
    # arena's unmapper thread. The real driver frees a released handle's memory only
    # once no range maps it, so empty_cache must hand back what vmmarena says it released.
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    handed = vmmarena.snapshot(DEV)["pool"].get("unmapped_in_background", 0)
    kept = []
    for _ in range(160):
        parts = [torch.empty(2 * MiB, dtype=torch.uint8, device="cuda").fill_(1) for _ in range(3)]
        del parts
        kept.append(torch.empty(6 * MiB, dtype=torch.uint8, device="cuda").fill_(2))
    torch.cuda.synchronize()
    kept.append(torch.empty(8 * MiB, dtype=torch.uint8, device="cuda"))  # a new range: the oldest retired go
    handed = vmmarena.snapshot(DEV)["pool"].get("unmapped_in_background", 0) - handed
    check(handed > 0, "no retired range went to the unmapper thread: nothing to wait for")
    del kept
    torch.cuda.synchronize()
    reserved, free_before = torch.cuda.memory_reserved(), torch.cuda.mem_get_info(DEV)[0]
    torch.cuda.empty_cache()
    released = reserved - torch.cuda.memory_reserved()
    gained = torch.cuda.mem_get_info(DEV)[0] - free_before
    print(f"  {handed} ranges unmapped in the background; empty_cache released {released / MiB:.0f} MiB, "
          f"the device gained {gained / MiB:.0f} MiB")
    check(released >= 960 * MiB, f"empty_cache released only {released} bytes of the 968 MiB freed")
    check(gained >= released - 16 * MiB, f"vmmarena released {released} bytes, the device gained {gained}")


def driver_calls(name):
    return vmmarena.snapshot(DEV)["driver"].get(name, {}).get("calls", 0)


def test_a_freed_tensor_grows_in_place():
    # VMMARENA_GROW=on: a freed 64 MiB tensor's memory serves a 96 MiB one where it is mapped;
    # only the new 32 MiB are mapped beside it and given access. On the real driver: what the
    # kept handles held is still there, kernels write and read across the seam, and once freed
    # the grown mapping is unmapped whole, so empty_cache gives the device everything back.
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    grown = vmmarena.snapshot(DEV)["pool"].get("grown_in_place", 0)
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda").fill_(7)
    torch.cuda.synchronize()
    base = x.data_ptr()
    del x
    free_before = torch.cuda.mem_get_info(DEV)[0]
    maps, access = driver_calls("cuMemMap"), driver_calls("cuMemSetAccess")
    y = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")
    check(vmmarena.snapshot(DEV)["pool"].get("grown_in_place", 0) == grown + 1, "the 96 MiB request grew nothing")
    check(y.data_ptr() in (base, base - 32 * MiB), f"grown at 0x{y.data_ptr():x}, the freed tensor was at 0x{base:x}")
    # counted before the comparison below, whose result is a tensor of its own
    new_access, new_maps = driver_calls("cuMemSetAccess") - access, driver_calls("cuMemMap") - maps
    check(new_access == 1, f"{new_access} cuMemSetAccess calls for the new part, not one")
    kept = y[:64 * MiB] if y.data_ptr() == base else y[32 * MiB:]
    check(bool((kept == 7).all()), "the kept handles' contents changed: they were not the same memory")
    y.fill_(3)
    total = int(y.sum(dtype=torch.int64))
    print(f"  grown {'up' if y.data_ptr() == base else 'down'}: {new_maps} handle(s) mapped for 32 MiB; "
          f"device free {free_before / MiB:.0f} -> {torch.cuda.mem_get_info(DEV)[0] / MiB:.0f} MiB")
    check(total == 3 * 96 * MiB, f"sum over the grown tensor {total}, not {3 * 96 * MiB}")
    del y, kept
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    gained = torch.cuda.mem_get_info(DEV)[0] - free_before
    # x's 64 MiB were held when free_before was read, the new 32 MiB made after: both go back
    check(gained >= 48 * MiB, f"empty_cache gave the device {gained} bytes of the 96 MiB grown mapping")


def test_a_capture_draws_from_the_cache_its_entry_keeps():
    torch.cuda.synchronize()
    held = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda").fill_(1) for _ in range(4)]
    del held
    cached, reserved = usage()["cached_bytes"], torch.cuda.memory_reserved()
    check(cached >= 1 * GiB, f"only {cached} bytes cached: nothing for the capture to reuse")
    created = driver_calls("cuMemCreate")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        reserved_in_capture = torch.cuda.memory_reserved()
        out = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        out.fill_(2)
    check(reserved_in_capture == reserved,
          f"torch.cuda.graph's entry changed what vmmarena holds: {reserved} -> {reserved_in_capture} bytes")
    check(driver_calls("cuMemCreate") == created, "the capture created memory with 1 GiB cached")
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    check(int(out[0]) == 2 and int(out[-1]) == 2, "the replay did not write the cached memory it was given")
    print(f"  {cached / GiB:.2f} GiB cached; the capture's 512 MiB came from it (no cuMemCreate)")
    del g, out
    gc.collect()


def test_graph_memory_returns_when_the_graph_is_deleted():
    n = 512 * MiB
    torch.cuda.empty_cache()  # the deleted graph's mapping is then the only one of its size cached
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        scratch = torch.empty(n, dtype=torch.uint8, device="cuda")
        scratch.fill_(3)
        total = scratch.sum()
    scratch_ptr = scratch.data_ptr()
    served(scratch, "the capture's scratch")
    del scratch  # freed into the graph's pool
    eager = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(eager.data_ptr() != scratch_ptr, "eager work got a living graph's memory")
    eager.fill_(9)
    g.replay()
    torch.cuda.synchronize()
    check(int(total) == 3 * n, f"the graph read {int(total)}, expected {3 * n}")
    reserved = torch.cuda.memory_reserved()
    del g, total
    gc.collect()
    again = torch.empty(n, dtype=torch.uint8, device="cuda")
    check(again.data_ptr() == scratch_ptr, "the deleted graph's memory did not return to the cache")
    check(torch.cuda.memory_reserved() <= reserved, "the allocation after the deletion needed new memory")
    del eager, again


def capture(graph, fill, n, stream, pool=None):
    """Captures `graph` filling n bytes with `fill` and summing them, on `stream`, with
    capture_begin/capture_end: torch.cuda.graph would empty the cache first, and the
    test needs the shared pool's free memory kept. Returns (the sum, the buffer's address)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        t = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(fill)
        out = t.sum()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return out, t.data_ptr()


def test_two_graphs_share_a_pool():
    n = 256 * MiB
    stream = torch.cuda.Stream()
    g1, g2, g3 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    out1, p1 = capture(g1, 1, n, stream)
    out2, p2 = capture(g2, 2, n, stream, pool=g1.pool())
    out3, p3 = capture(g3, 4, n, stream)
    lib, ctypes = vmmarena._lib.lib(), vmmarena._lib.ctypes
    uses = ctypes.c_long()
    shared = lib.vmm_torch_process_pool_of(DEV, g1.pool()[0], g1.pool()[1], ctypes.byref(uses))
    check(shared != 0 and uses.value == 2, f"g1's pool: vmm pool {shared}, {uses.value} uses (expected 2)")
    check(p2 == p1, "the graph captured with pool=g1.pool() did not reuse g1's freed memory")
    check(p3 != p1, "a graph with a pool of its own got another graph's memory")
    for g in (g1, g2, g3):
        g.replay()
    torch.cuda.synchronize()
    check((int(out1), int(out2), int(out3)) == (n, 2 * n, 4 * n), (int(out1), int(out2), int(out3)))
    pool = g2.pool()
    del g1
    gc.collect()
    lib.vmm_torch_process_pool_of(DEV, pool[0], pool[1], ctypes.byref(uses))
    check(uses.value == 1, f"{uses.value} uses of the shared pool after one graph was deleted")
    del g2, g3, out1, out2, out3
    gc.collect()
    check(lib.vmm_torch_process_pool_of(DEV, pool[0], pool[1], None) == 0, "the shared pool outlived its graphs")


def test_pause_takes_exactly_one_tags_tensors():
    storage = vmmarena.Storage(DEV)
    sizes = (4096, 96 * 1024, 8 * MiB)
    with storage.tag("kv"):
        kv = [torch.full((n // 4,), 1.5, device="cuda") for n in sizes]
    with storage.tag("other"):
        other = [torch.full((n // 4,), 2.5, device="cuda") for n in sizes]
    plain = [torch.full((n // 4,), 3.5, device="cuda") for n in sizes]
    snap = vmmarena.snapshot(DEV)
    kv_maps = {containing(snap, t.data_ptr())["base"] for t in kv}
    others = {containing(snap, t.data_ptr())["base"] for t in other + plain}
    check(not kv_maps & others, "a 'kv' tensor shares a mapping or page with another tag's")
    physical = snap["totals"]["physical_bytes"]
    storage.pause("kv", backup=True)
    snap = vmmarena.snapshot(DEV)
    states = {m["base"]: m["state"] for m in snap["mappings"]}
    check({states[b] for b in kv_maps} == {"paused"}, "a 'kv' tensor was not paused")
    check({states[b] for b in others} == {"live"}, "a tensor of another tag was paused")
    check(snap["totals"]["physical_bytes"] < physical, "pausing freed no memory")
    check(all(bool((t == v).all()) for ts, v in ((other, 2.5), (plain, 3.5)) for t in ts), "others changed")
    storage.resume("kv")
    check(all(bool((t == 1.5).all()) for t in kv), "the 'kv' tensors lost their contents over pause/resume")
    del kv, other, plain


def test_memory_allocated_and_its_peak():
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    requested = torch.cuda.memory_stats()["requested_bytes.all.current"]
    check(torch.cuda.max_memory_allocated() == base, "reset_peak_memory_stats() did not reset the peak")
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    check(torch.cuda.memory_allocated() == base + 256 * MiB, (base, torch.cuda.memory_allocated()))
    check(torch.cuda.memory_reserved() >= torch.cuda.memory_allocated(), "reserved below allocated")
    del x
    check(torch.cuda.memory_allocated() == base, "memory_allocated() did not go down on the free")
    check(torch.cuda.max_memory_allocated() == base + 256 * MiB, torch.cuda.max_memory_allocated())
    check(torch.cuda.max_memory_reserved() >= base + 256 * MiB, torch.cuda.max_memory_reserved())
    stats = torch.cuda.memory_stats()
    # requested: the bytes asked for; allocated: the extents and slots that serve them
    check(stats["allocated_bytes.all.current"] == base and stats["requested_bytes.all.current"] == requested, stats)
    check(requested <= base, (requested, base))
    check("Allocated memory" in torch.cuda.memory_summary(), "memory_summary() failed")


def test_checkpointing_of_cudagraph_trees_fails_clearly():
    # Supported now (tests/gpu/test_native_allocator.py); a pool nobody holds is refused clearly.
    try:
        torch._C._cuda_getCheckpointState(DEV, (1 << 40, 0))
    except RuntimeError as e:
        check("vmmarena" in str(e) and "is not in use" in str(e), str(e))
        return
    raise AssertionError("getCheckpointState of an unknown pool did not fail")


TESTS = [
    test_install_before_cuda_only,
    test_forward_bitwise_equal_to_native,
    test_memory_allocated_and_its_peak,
    test_out_of_memory_raises_and_recovers,
    test_memory_fraction_caps_new_memory,
    test_record_stream_keeps_memory_until_the_stream_is_done,
    test_a_side_stream_free_serves_main_only_once_done,
    test_empty_cache_returns_memory_to_the_driver,
    test_empty_cache_waits_for_background_unmaps,
    test_pause_takes_exactly_one_tags_tensors,
    test_checkpointing_of_cudagraph_trees_fails_clearly,
    test_graph_replay_unchanged_after_eager_churn,
    test_graph_memory_returns_when_the_graph_is_deleted,
    test_two_graphs_share_a_pool,
    test_a_capture_draws_from_the_cache_its_entry_keeps,
    test_a_freed_tensor_grows_in_place,
]
check_listed(TESTS, globals())


def main():
    deterministic()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(DEV)}, library {vmmarena.library_path()}")
    return run("process", TESTS)


if __name__ == "__main__":
    if CHILD:
        child_main(CHILDREN)
    sys.exit(main())
