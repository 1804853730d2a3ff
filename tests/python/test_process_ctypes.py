"""CI tests of whole-process mode (vmmarena.install()) on the fake driver, through ctypes: the
shim's C entry points (caching, kinds, tags, pages, graph pools, record_stream, empty_cache,
usage), the C++ hooks PyTorch calls (through their test wrappers, which catch what they
throw), the statistics PyTorch is given, and install() against a stand-in for torch.

Environment as test_shim_ctypes.py (the python_process CMake test). Runs in a process of its
own: the caching setting and install() hold for the process.
"""

import ctypes
import importlib.util
import os
import sys
import threading
import types
import unittest

import vmmarena
from vmmarena import _lib, _process, _storage, _torch_stats

import fake_driver

KiB, MiB = 1 << 10, 1 << 20
PACKAGE, TRANSIENT = 0, 1
A = ctypes.c_void_p(0x5001)  # fake streams: any non-NULL value
B = ctypes.c_void_p(0x5002)

shim = _lib.lib()
fake = fake_driver.load()
HOOKS = _lib.has_process_hooks(shim)


def allocate(size, stream=A, pool=0, device=0):
    """vmm_torch_process_allocate: (status, pointer or None, message)."""
    out = ctypes.c_void_p()
    msg = ctypes.create_string_buffer(1024)
    status = shim.vmm_torch_process_allocate(size, device, stream, pool, ctypes.byref(out), msg, len(msg))
    return status, out.value, msg.value.decode()


def take(size, stream=A, pool=0):
    status, ptr, msg = allocate(size, stream, pool)
    if status != _lib.VMM_OK or not ptr:
        raise AssertionError(f"allocate({size}) failed: {_lib.status_name(status)}: {msg}")
    return ptr


def free(ptr, stream=A, device=0):
    shim.vmm_torch_free(ptr, 0, device, stream)


def snap():
    return vmmarena.snapshot(0)


def calls(name, snapshot=None):
    return (snapshot or snap())["driver"].get(name, {}).get("calls", 0)


def syncs(snapshot=None):
    snapshot = snapshot or snap()
    return calls("cuStreamSynchronize", snapshot) + calls("cuCtxSynchronize", snapshot)


def containing(ptr, snapshot=None):
    for m in (snapshot or snap())["mappings"]:
        base = int(m["base"], 16)
        if base <= ptr < base + m["extent"]:
            return m
    return None


def hook_malloc(size, stream=A, device=0):
    """The C++ malloc: (pointer or None, what() of what it threw or "")."""
    out = ctypes.c_void_p()
    msg = ctypes.create_string_buffer(2048)
    threw = shim.vmm_torch_process_test_malloc(size, device, stream, ctypes.byref(out), msg, len(msg))
    return out.value, msg.value.decode() if threw else ""


def hook(name, *args):
    """Another C++ hook through its test wrapper: what() of what it threw, or ""."""
    msg = ctypes.create_string_buffer(2048)
    threw = getattr(shim, "vmm_torch_process_test_" + name)(*args, msg, len(msg))
    return msg.value.decode() if threw else ""


class StreamFilter:
    """A C filter accepting the given streams, kept alive with the capture that uses it."""

    def __init__(self, *streams):
        self.streams = {s.value for s in streams}
        self.fn = _lib.TEST_FILTER(lambda stream, ctx: 1 if stream in self.streams else 0)


def begin(pool_id, filt, device=0):
    return hook("begin_pool", device, pool_id[0], pool_id[1], filt.fn, None)


def end(pool_id, device=0):
    return hook("end_pool", device, pool_id[0], pool_id[1])


def release(pool_id, device=0):
    return hook("release_pool", device, pool_id[0], pool_id[1])


def pool_of(pool_id, device=0):
    uses = ctypes.c_long()
    return shim.vmm_torch_process_pool_of(device, pool_id[0], pool_id[1], ctypes.byref(uses)), uses.value


# ---- The native allocator's bookkeeping (vmm_torch_native_*) ------------------------------


class Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("current", "peak", "allocated", "freed")]


STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
               "inactive_split_bytes", "requested_bytes")


class DeviceStats(ctypes.Structure):
    """vmm_torch_device_stats (shim/vmmarena_torch_process.h)."""

    _fields_ = ([(name, Stat * 3) for name in STAT_ARRAYS]
                + [("num_alloc_retries", ctypes.c_int64), ("num_ooms", ctypes.c_int64),
                   ("oversize_allocations", Stat), ("oversize_segments", Stat)]
                + [(name, ctypes.c_int64) for name in ("num_sync_all_streams", "num_device_alloc", "num_device_free",
                                                       "max_split_size", "cached_bytes", "held_count", "held_bytes")])


class Segment(ctypes.Structure):
    _fields_ = [("address", ctypes.c_size_t), ("size", ctypes.c_size_t), ("stream", ctypes.c_void_p),
                ("pool_first", ctypes.c_ulonglong), ("pool_second", ctypes.c_ulonglong), ("is_page", ctypes.c_int),
                ("first_block", ctypes.c_size_t), ("block_count", ctypes.c_size_t)]


class Block(ctypes.Structure):
    _fields_ = [("address", ctypes.c_size_t), ("size", ctypes.c_size_t), ("requested", ctypes.c_size_t),
                ("state", ctypes.c_int)]


def _native_prototypes():
    if not hasattr(shim, "vmm_torch_native_alloc"):
        return False
    c_int, c_size, c_void, c_buf, c_ull = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulonglong
    P = ctypes.POINTER
    protos = {
        "vmm_torch_native_alloc": (c_int, c_size, c_int, c_void, P(c_void), c_buf, c_size),
        "vmm_torch_native_free": (c_int, c_void, P(c_int), c_buf, c_size),
        "vmm_torch_native_lookup": (c_int, c_void, P(c_int), P(c_void), P(c_size)),
        "vmm_torch_native_stats": (c_int, c_int, P(DeviceStats)),
        "vmm_torch_native_stats_size": (c_size,),
        "vmm_torch_native_reset_peaks": (c_int, c_int),
        "vmm_torch_native_reset_accumulated": (c_int, c_int),
        "vmm_torch_native_pool_uses": (c_int, c_int, c_ull, c_ull),
        "vmm_torch_native_pool_live_equal": (c_int, c_int, c_ull, c_ull, P(c_void), c_size),
        "vmm_torch_native_pool_live_count": (c_size, c_int, c_ull, c_ull),
        "vmm_torch_native_checkpoint": (c_int, c_int, c_ull, c_ull, P(c_void), c_buf, c_size),
        "vmm_torch_native_checkpoint_count": (c_size, c_void),
        "vmm_torch_native_checkpoint_drop": (None, c_void),
        "vmm_torch_native_restore": (c_int, c_void, P(c_void), c_size, P(c_size), P(c_void), c_size, P(c_size), c_buf,
                                     c_size),
        "vmm_torch_process_test_incref_pool": (c_int, c_int, c_ull, c_ull, c_buf, c_size),
        "vmm_torch_native_segments": (c_int, c_int, c_ull, c_ull, P(Segment), c_size, P(c_size), P(Block), c_size,
                                      P(c_size), c_buf, c_size),
    }
    for name, (restype, *argtypes) in protos.items():
        fn = getattr(shim, name)
        fn.restype, fn.argtypes = restype, argtypes
    return True


NATIVE = _native_prototypes()


def native_take(size, stream=A, device=0):
    out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
    status = shim.vmm_torch_native_alloc(size, device, stream, ctypes.byref(out), msg, len(msg))
    if status != _lib.VMM_OK:
        raise AssertionError(f"native alloc({size}) failed: {_lib.status_name(status)}: {msg.value.decode()}")
    return out.value


def native_free(ptr):
    """(status, message)."""
    msg = ctypes.create_string_buffer(1024)
    return shim.vmm_torch_native_free(ptr, None, msg, len(msg)), msg.value.decode()


def native_stats(device=0):
    out = DeviceStats()
    assert shim.vmm_torch_native_stats(device, ctypes.byref(out)) == _lib.VMM_OK
    return out


def native_segments(pool=(0, 0)):
    """[(Segment, [Block...])]."""
    segs, blocks = (Segment * 64)(), (Block * 512)()
    n_seg, n_block, msg = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.create_string_buffer(1024)
    status = shim.vmm_torch_native_segments(0, pool[0], pool[1], segs, 64, ctypes.byref(n_seg), blocks, 512,
                                            ctypes.byref(n_block), msg, len(msg))
    assert status == _lib.VMM_OK and n_seg.value <= 64 and n_block.value <= 512, msg.value
    return [(segs[i], [blocks[b] for b in range(segs[i].first_block, segs[i].first_block + segs[i].block_count)])
            for i in range(n_seg.value)]


def live_equal(pool, ptrs):
    arr = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
    return shim.vmm_torch_native_pool_live_equal(0, pool[0], pool[1], arr, len(ptrs))


class Base(unittest.TestCase):
    def setUp(self):
        self.saved_env = fake_driver.clear_settings()
        shim.vmm_torch_set_driver_for_testing(None)
        if HOOKS:
            shim.vmm_torch_process_test_reset()
        _lib.set_caching(True)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        self.assertEqual(shim.vmm_torch_set_kind(TRANSIENT), TRANSIENT)

    def tearDown(self):
        shim.vmm_torch_set_kind(TRANSIENT)
        shim.vmm_torch_set_driver_for_testing(None)
        if HOOKS:
            shim.vmm_torch_process_test_reset()
        _lib.set_caching(False)  # as a process that never installed: other tests may follow
        fake_driver.restore_settings(self.saved_env)
        first = fake.fake_first_error()
        self.assertEqual(fake.fake_ledger_clean(), 1, f"fake ledger not clean: {first}")


class ShimEntryPoints(Base):
    """The C entry points of whole-process mode."""

    def test_caching_is_refused_once_an_arena_exists(self):
        self.assertEqual(shim.vmm_torch_caching(), 1)
        ptr = take(4 * MiB)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            _lib.set_caching(False)
        self.assertIn("caching off refused: device 0's arena exists already", str(cm.exception))
        self.assertEqual(cm.exception.status_name, "VMM_ERR_INVALID_ARGUMENT")
        _lib.set_caching(True)  # the setting in force: accepted
        self.assertEqual(shim.vmm_torch_caching(), 1)
        free(ptr)

    def test_caching_keeps_freed_memory_and_hits_without_a_driver_call(self):
        ptr = take(8 * MiB)
        free(ptr)
        before = snap()
        self.assertEqual(before["totals"]["physical_bytes"], 8 * MiB, "the free gave the memory back: not caching")
        again = take(8 * MiB)
        after = snap()
        self.assertEqual(again, ptr)
        for entry in ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuStreamWaitEvent", "cuStreamSynchronize"):
            self.assertEqual(calls(entry, after), calls(entry, before), f"{entry} called on an exact-size hit")
        free(again)

    def test_without_caching_a_free_releases(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        free(take(8 * MiB))
        self.assertEqual(snap()["totals"]["physical_bytes"], 0)

    def test_kind_is_per_thread_and_reaches_the_allocation(self):
        self.assertEqual(shim.vmm_torch_kind(), TRANSIENT)
        self.assertEqual(shim.vmm_torch_set_kind(7), -1)
        self.assertEqual(shim.vmm_torch_kind(), TRANSIENT)
        self.assertEqual(shim.vmm_torch_set_kind(PACKAGE), TRANSIENT)
        seen = []
        worker = threading.Thread(target=lambda: seen.append(shim.vmm_torch_kind()))
        worker.start()
        worker.join()
        self.assertEqual(seen, [TRANSIENT], "another thread saw this thread's kind")
        weights = take(4 * MiB)
        shim.vmm_torch_set_kind(TRANSIENT)
        scratch = take(4 * MiB)
        now = snap()
        self.assertEqual(containing(weights, now)["kind"], "package")
        self.assertEqual(containing(scratch, now)["kind"], "transient")
        free(weights)
        free(scratch)

    def test_small_requests_share_a_page_of_their_tag(self):
        first, second = take(4 * KiB), take(4 * KiB)
        shim.vmm_torch_tag_push(b"kv")
        tagged = take(4 * KiB)
        shim.vmm_torch_tag_pop()
        now = snap()
        page = containing(first, now)
        self.assertIsNotNone(page)
        self.assertEqual(page["extent"], 2 * MiB, "a small request did not come from a one-granule page")
        self.assertEqual(containing(second, now)["base"], page["base"], "two small requests of one kind and tag in two pages")
        self.assertNotEqual(first, second)
        other = containing(tagged, now)
        self.assertNotEqual(other["base"], page["base"], "another tag's request landed in the same page")
        self.assertEqual(other["tag"], "kv")
        usage = _lib.usage(0)
        self.assertEqual((usage["pages"], usage["page_slots_used"]), (2, 3), usage)
        for ptr in (first, second, tagged):
            free(ptr)
        self.assertEqual(_lib.usage(0)["page_slots_used"], 0)

    def test_small_requests_are_aligned_as_pytorchs(self):
        # PyTorch's allocator aligns every block to 512 bytes; kernels (cuBLAS among them)
        # choose their code by alignment, so results equal native's only with the same.
        ptrs = [take(size) for size in (1, 100, 513, 4 * KiB, 96 * KiB, MiB + 1)]
        self.assertEqual([p % 512 for p in ptrs], [0] * len(ptrs), [hex(p) for p in ptrs])
        self.assertEqual(len(set(ptrs)), len(ptrs))
        for ptr in ptrs:
            free(ptr)

    def test_a_pool_keeps_its_memory_until_released(self):
        pool = 41
        ptr = take(6 * MiB, pool=pool)
        free(ptr)
        shared = take(6 * MiB)
        self.assertNotEqual(shared, ptr, "the shared cache got a graph pool's memory while the pool lives")
        again = take(6 * MiB, pool=pool)
        self.assertEqual(again, ptr, "the pool did not get its own memory back")
        free(again)
        self.assertEqual(shim.vmm_torch_release_pool(0, pool), _lib.VMM_OK, vmmarena.last_error(0))
        reused = take(6 * MiB)
        self.assertEqual(reused, ptr, "a released pool's cache did not join the shared cache")
        status, out, msg = allocate(6 * MiB, pool=pool)
        self.assertEqual((status, out), (_lib.VMM_ERR_INVALID_ARGUMENT, None), msg)
        self.assertTrue(msg, "no message for an allocation into a released pool")
        free(shared)
        free(reused)

    def test_release_pool_of_the_shared_cache_or_without_an_arena(self):
        self.assertEqual(shim.vmm_torch_release_pool(0, 5), _lib.VMM_OK)  # no arena yet: nothing to do
        free(take(MiB))
        self.assertEqual(shim.vmm_torch_release_pool(0, 0), _lib.VMM_ERR_INVALID_ARGUMENT)
        self.assertTrue(vmmarena.last_error(0))
        self.assertEqual(shim.vmm_torch_release_pool(64, 5), _lib.VMM_ERR_INVALID_ARGUMENT)

    def test_record_stream(self):
        msg = ctypes.create_string_buffer(512)
        self.assertEqual(shim.vmm_torch_record_stream(None, B, msg, len(msg)), _lib.VMM_OK)
        status = shim.vmm_torch_record_stream(0xDEAD0000, B, msg, len(msg))
        self.assertEqual(status, _lib.VMM_ERR_UNKNOWN_POINTER)
        self.assertIn("record_stream(0xdead0000", msg.value.decode())
        # Without record_stream a free and a same-stream reuse wait for nothing ...
        ptr = take(4 * MiB)
        free(ptr)
        waits = calls("cuStreamWaitEvent")
        self.assertEqual(take(4 * MiB), ptr)
        self.assertEqual(calls("cuStreamWaitEvent"), waits)
        # ... with it the reuse is asked of stream B's work (queried; no stream made to wait).
        self.assertEqual(shim.vmm_torch_record_stream(ptr, B, msg, len(msg)), _lib.VMM_OK, msg.value)
        free(ptr)
        queries = calls("cuEventQuery")
        self.assertEqual(take(4 * MiB), ptr)
        self.assertGreater(calls("cuEventQuery"), queries, "the reuse did not ask whether the recorded stream was done")
        self.assertEqual(calls("cuStreamWaitEvent"), waits, "a stream was made to wait for the recorded stream")
        free(ptr)

    def test_reuse_on_another_stream_once_its_free_completed(self):
        ptr = take(4 * MiB, stream=A)
        free(ptr, stream=A)
        before = snap()
        self.assertEqual(take(4 * MiB, stream=B), ptr)  # the fake device has run A's work
        after = snap()
        self.assertGreater(calls("cuEventQuery", after), calls("cuEventQuery", before))
        self.assertEqual(calls("cuStreamWaitEvent", after), calls("cuStreamWaitEvent", before),
                         "stream B was made to wait for A's work")
        self.assertEqual(syncs(after), syncs(before), "the host waited on the allocation path")
        free(ptr, stream=B)

    def test_empty_cache_gives_the_memory_back(self):
        kept = take(2 * MiB)
        for size in (4 * MiB, 10 * MiB, 64 * KiB):
            free(take(size))
        usage = _lib.usage(0)
        self.assertGreater(usage["cached_bytes"], 0)
        msg = ctypes.create_string_buffer(512)
        self.assertEqual(shim.vmm_torch_empty_cache(msg, len(msg)), _lib.VMM_OK, msg.value)
        usage = _lib.usage(0)
        self.assertEqual(usage["cached_bytes"], 0)
        self.assertEqual(usage["reserved_bytes"], 2 * MiB)
        self.assertEqual(snap()["totals"]["physical_bytes"], 2 * MiB)
        free(kept)

    def test_usage_and_reset_peaks(self):
        self.assertEqual(shim.vmm_torch_usage_size(), ctypes.sizeof(_lib.Usage))
        self.assertEqual(set(_lib.usage(0).values()), {0}, "a device with no arena has usage")
        a, b = take(4 * MiB), take(6 * MiB)
        usage = _lib.usage(0)
        self.assertEqual((usage["allocated_bytes"], usage["allocations"]), (10 * MiB, 2))
        self.assertEqual(usage["reserved_bytes"], 10 * MiB)
        free(b)
        usage = _lib.usage(0)
        self.assertEqual((usage["allocated_bytes"], usage["allocated_peak_bytes"]), (4 * MiB, 10 * MiB))
        self.assertEqual((usage["alloc_count"], usage["free_count"]), (2, 1))
        _lib.reset_peaks(0)
        usage = _lib.usage(0)
        self.assertEqual(usage["allocated_peak_bytes"], 4 * MiB)
        self.assertEqual(usage["allocations_peak"], 1)
        free(a)
        self.assertEqual(shim.vmm_torch_usage(64, ctypes.byref(_lib.Usage())), _lib.VMM_ERR_INVALID_ARGUMENT)

    def test_a_refusal_has_the_numbers_and_changes_nothing(self):
        os.environ["VMMARENA_LIMIT"] = "8M"
        kept = take(6 * MiB)
        before = snap()
        status, ptr, msg = allocate(4 * MiB)
        self.assertEqual((status, ptr), (_lib.VMM_ERR_OUT_OF_MEMORY, None))
        self.assertIn("limit 8.0 MiB", msg)
        self.assertIn("requested 4194304 B", msg)
        self.assertEqual(vmmarena.last_error(0), msg)
        after = snap()
        self.assertEqual(after["totals"]["physical_bytes"], before["totals"]["physical_bytes"])
        self.assertEqual(_lib.usage(0)["refusals"], 1)
        self.assertIsNone(after["fatal_error"])
        free(kept)
        free(take(8 * MiB))  # the process carries on

    def test_zero_size_and_bad_device(self):
        self.assertEqual(allocate(0), (_lib.VMM_OK, None, ""))
        status, ptr, msg = allocate(MiB, device=64)
        self.assertEqual((status, ptr), (_lib.VMM_ERR_INVALID_ARGUMENT, None))
        self.assertIn("out of range", msg)


@unittest.skipUnless(HOOKS, "the shim was built without its C++ part")
class CxxHooks(Base):
    """The hooks PyTorch calls, through their test wrappers."""

    def test_malloc_throws_out_of_memory_with_the_numbers(self):
        os.environ["VMMARENA_LIMIT"] = "8M"
        self.assertEqual(hook_malloc(0), (None, ""))
        kept, error = hook_malloc(6 * MiB)
        self.assertTrue(kept and not error, error)
        ptr, error = hook_malloc(4 * MiB)
        self.assertIsNone(ptr)
        self.assertTrue(error.startswith("CUDA out of memory: vmmarena refused 4194304 bytes on device 0 "
                                         "(VMM_ERR_OUT_OF_MEMORY): "), error)
        self.assertIn("limit 8.0 MiB", error)
        free(kept)
        ptr, error = hook_malloc(8 * MiB)
        self.assertTrue(ptr and not error, f"no recovery after the refusal: {error}")
        free(ptr)

    def test_malloc_of_a_bad_device_throws(self):
        ptr, error = hook_malloc(MiB, device=64)
        self.assertIsNone(ptr)
        self.assertIn("vmmarena allocation failed: vmmarena refused 1048576 bytes on device 64", error)

    def test_a_capture_routes_its_stream_into_its_pool(self):
        graph = (7, 0)
        on_a = StreamFilter(A)
        self.assertEqual(begin(graph, on_a), "")
        pool, uses = pool_of(graph)
        self.assertTrue(pool > 0 and uses == 1, (pool, uses))
        self.assertEqual(shim.vmm_torch_process_captures(0, None), 1)
        in_pool, _ = hook_malloc(6 * MiB, stream=A)
        eager, _ = hook_malloc(6 * MiB, stream=B)  # not the capture's stream: shared cache
        free(in_pool)
        self.assertEqual(end(graph), "")
        self.assertEqual(shim.vmm_torch_process_captures(0, None), 0)
        outside, _ = hook_malloc(6 * MiB, stream=A)
        self.assertNotEqual(outside, in_pool, "eager work got the memory of a graph that still lives")
        # A second graph captured into the same pool (pool=g.pool()) gets it back.
        self.assertEqual(begin(graph, on_a), "")
        self.assertEqual(pool_of(graph), (pool, 2))
        again, _ = hook_malloc(6 * MiB, stream=A)
        self.assertEqual(again, in_pool, "a graph sharing the pool did not reuse its memory")
        free(again)
        self.assertEqual(end(graph), "")
        # Each graph's reset releases one use; the last one gives the memory to the shared cache.
        self.assertEqual(release(graph), "")
        self.assertEqual(pool_of(graph), (pool, 1))
        self.assertEqual(release(graph), "")
        self.assertEqual(pool_of(graph), (0, 0))
        shared, _ = hook_malloc(6 * MiB, stream=A)
        self.assertEqual(shared, in_pool, "the released pool's memory did not reach the shared cache")
        for ptr in (eager, outside, shared):
            free(ptr)

    def test_two_captures_each_get_their_streams(self):
        first, second = (1, 0), (0, 9)
        f1, f2 = StreamFilter(A), StreamFilter(B)
        self.assertEqual(begin(first, f1), "")
        self.assertEqual(begin(second, f2), "")
        self.assertIn("is already being allocated to", begin(first, f1))
        self.assertEqual(pool_of(first)[1], 1, "a refused begin counted a use")
        p1, p2 = pool_of(first)[0], pool_of(second)[0]
        self.assertNotEqual(p1, p2)
        x, _ = hook_malloc(4 * MiB, stream=A)
        y, _ = hook_malloc(4 * MiB, stream=B)
        free(x, stream=A)
        free(y, stream=B)
        self.assertEqual(end(first), "")
        # Only the second capture routes now: stream A allocates from the shared cache.
        z, _ = hook_malloc(4 * MiB, stream=A)
        self.assertNotIn(z, (x, y))
        w, _ = hook_malloc(4 * MiB, stream=B)
        self.assertEqual(w, y, "the second capture's pool did not serve its stream")
        free(w, stream=B)
        self.assertEqual(end(second), "")
        for pid in (first, second):
            release(pid)
        free(z)

    def test_capture_path_never_synchronizes_and_release_waits_for_the_capture(self):
        old, graph = (3, 0), (4, 0)
        on_a = StreamFilter(A)
        begin(old, on_a)
        free(hook_malloc(8 * MiB, stream=A)[0], stream=A)
        end(old)
        fake.fake_set_capturing(A, 1)
        try:
            before = syncs()
            begin(graph, on_a)
            ptr, error = hook_malloc(8 * MiB, stream=A)
            self.assertEqual(error, "")
            free(ptr, stream=A)
            self.assertEqual(release(old), "")  # the old graph dies during the capture
            waiting = ctypes.c_int()
            self.assertEqual(shim.vmm_torch_process_captures(0, ctypes.byref(waiting)), 1)
            self.assertEqual(waiting.value, 1, "the release did not wait for the capture")
            self.assertIn("capture(s) are underway on device 0", hook("empty_cache"))
            self.assertEqual(syncs(), before, "something synchronized during the capture")
        finally:
            fake.fake_set_capturing(A, 0)
        end(graph)
        waiting = ctypes.c_int()
        shim.vmm_torch_process_captures(0, ctypes.byref(waiting))
        self.assertEqual(waiting.value, 0, "the waiting release did not run when the capture ended")
        release(graph)

    def test_a_free_during_a_capture_is_reused_only_after_it(self):
        eager = take(4 * MiB, stream=A)  # memory the captured work may read
        # A capturing, its allocations routed elsewhere: a same-stream request would take the
        # freed memory at once, were it not for the capture.
        graph, elsewhere = (8, 0), StreamFilter(ctypes.c_void_p(0x5003))
        self.assertEqual(begin(graph, elsewhere), "")
        fake.fake_set_capturing(A, 1)
        try:
            free(eager, stream=A)
            during, error = hook_malloc(4 * MiB, stream=A)
            self.assertEqual(error, "")
            self.assertNotEqual(during, eager, "memory freed during a capture was reused before it ended")
        finally:
            fake.fake_set_capturing(A, 0)
        self.assertEqual(end(graph), "")
        after, _ = hook_malloc(4 * MiB, stream=A)
        self.assertEqual(after, eager, "the memory did not come back once the capture ended")
        free(during, stream=A)
        free(after, stream=A)
        release(graph)

    def test_begin_pool_refused_by_the_arena_throws_and_counts_nothing(self):
        os.environ["VMMARENA_LIMIT"] = "lots"
        error = begin((2, 0), StreamFilter(A))
        self.assertIn('beginAllocateToPool: pool (2, 0) of device 0: device 0: bad configuration: VMMARENA_LIMIT="lots"',
                      error)
        self.assertEqual(pool_of((2, 0)), (0, 0))
        self.assertEqual(shim.vmm_torch_process_captures(0, None), 0)

    def test_release_of_an_unknown_pool_is_a_no_op(self):
        self.assertEqual(release((99, 0)), "")
        self.assertEqual(release((0, 0), 64), "")

    def test_record_stream_and_empty_cache_hooks(self):
        self.assertIn("vmmarena: Tensor.record_stream: record_stream(0xdead0000",
                      hook("record_stream", 0xDEAD0000, B))
        ptr, _ = hook_malloc(4 * MiB)
        self.assertEqual(hook("record_stream", ptr, B), "")
        free(ptr)
        self.assertGreater(snap()["totals"]["physical_bytes"], 0)
        self.assertEqual(hook("empty_cache"), "")
        self.assertEqual(snap()["totals"]["physical_bytes"], 0)

    def test_memory_fraction_limits_new_memory_and_keeps_what_is_held(self):
        total = 80 << 30  # the fake device's capacity
        self.assertEqual(_lib.memory_fraction(0), 1.0, "no limit set, yet a fraction under 1")
        held = take(64 * MiB)
        self.assertEqual(hook("memory_fraction", 0.25, 0), "")
        self.assertEqual(snap()["limit_bytes"], total // 4)
        self.assertEqual(_lib.memory_fraction(0), 0.25)
        self.assertEqual(hook("memory_fraction", 2.0 ** -11, 0), "")  # 40 MiB, below the 64 MiB held
        self.assertEqual(snap()["limit_bytes"], 40 * MiB)
        self.assertEqual(snap()["totals"]["physical_bytes"], 64 * MiB, "setting the limit released memory")
        before = snap()
        status, ptr, msg = allocate(4 * MiB)
        self.assertEqual((_lib.status_name(status), ptr), ("VMM_ERR_OUT_OF_MEMORY", None))
        self.assertIn("limit 40.0 MiB < 64.0 MiB held + 4.0 MiB requested", msg)
        self.assertEqual(snap()["totals"], before["totals"], "a refusal changed what the arena holds")
        free(held)  # cached: one 64 MiB handle
        small = take(4 * MiB)
        self.assertEqual(small, held, "the new memory refused, the cached mapping did not serve")
        self.assertEqual(snap()["totals"]["physical_bytes"], 64 * MiB)
        self.assertEqual(hook("memory_fraction", 1.0, 0), "")
        self.assertEqual(snap()["limit_bytes"], total)
        self.assertEqual(_lib.memory_fraction(0), 1.0)
        free(small)

    def test_memory_fraction_zero_admits_no_new_memory(self):
        self.assertEqual(hook("memory_fraction", 0.0, 0), "")
        self.assertEqual(snap()["limit_bytes"], 1, "a limit of 0 would be none")
        self.assertLess(_lib.memory_fraction(0), 1e-9)
        status, ptr, msg = allocate(2 * MiB)
        self.assertEqual((_lib.status_name(status), ptr), ("VMM_ERR_OUT_OF_MEMORY", None))
        self.assertIn("limit 1 B < 0 B held + 2.0 MiB requested", msg)

    def test_memory_fraction_outside_0_to_1_or_a_bad_device_is_refused_and_changes_nothing(self):
        self.assertEqual(hook("memory_fraction", 0.5, 0), "")
        for fraction, text in ((1.5, "1.5"), (-0.25, "-0.25"), (float("nan"), "nan")):
            error = hook("memory_fraction", fraction, 0)
            self.assertIn(f"set_per_process_memory_fraction(): memory fraction {text} on device 0: outside 0..1", error)
            self.assertEqual(_lib.memory_fraction(0), 0.5)
        error = hook("memory_fraction", 0.5, 64)
        self.assertIn("memory fraction 0.5 on device 64: device ordinal out of range (vmmarena supports devices 0..63)",
                      error)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            _lib.memory_fraction(-1)
        self.assertIn("memory fraction of device -1: device ordinal out of range", str(cm.exception))


class TorchStatistics(Base):
    """What PyTorch's memory statistics answer in whole-process mode."""

    def test_the_dict_has_pytorchs_keys(self):
        usage = {name: 0 for name, _ in _lib.Usage._fields_}
        usage.update(allocated_bytes=5, allocated_peak_bytes=9, reserved_bytes=20, reserved_peak_bytes=30,
                     allocations=2, allocations_peak=4, alloc_count=11, free_count=9, refusals=3, cache_releases=1)
        flat = {}

        def flatten(prefix, value):  # as torch.cuda.memory_stats() does
            if isinstance(value, dict):
                for k, v in value.items():
                    flatten(f"{prefix}.{k}" if prefix else k, v)
            else:
                flat[prefix] = value

        flatten("", _torch_stats.device_stats(usage))
        expected = {
            "allocated_bytes.all.current": 5, "allocated_bytes.all.peak": 9, "active_bytes.all.current": 5,
            "requested_bytes.all.current": 5, "reserved_bytes.all.current": 20, "reserved_bytes.all.peak": 30,
            "allocation.all.current": 2, "allocation.all.peak": 4, "allocation.all.allocated": 11,
            "allocation.all.freed": 9, "num_ooms": 3, "num_alloc_retries": 1, "segment.all.current": 0,
        }
        for key, value in expected.items():
            self.assertEqual(flat.get(key), value, key)
        # Every key torch.cuda.memory_summary() reads.
        for metric in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes",
                       "allocation", "active", "segment", "inactive_split"):
            for pool in _torch_stats.POOL_KEYS:
                for stat in _torch_stats.STAT_KEYS:
                    self.assertIn(f"{metric}.{pool}.{stat}", flat)
        for metric in ("oversize_allocations", "oversize_segments"):
            for stat in _torch_stats.STAT_KEYS:
                self.assertIn(f"{metric}.{stat}", flat)
        self.assertTrue(all(isinstance(v, int) for v in flat.values()))

    def test_stats_follow_the_arena_and_reset(self):
        a = take(4 * MiB)
        free(take(2 * MiB))
        stats = _torch_stats.memory_stats(0)
        self.assertEqual(stats["allocated_bytes"]["all"]["current"], 4 * MiB)
        self.assertEqual(stats["allocated_bytes"]["all"]["peak"], 6 * MiB)
        self.assertEqual(stats["allocation"]["all"]["allocated"], 2)
        _torch_stats.reset_accumulated_memory_stats(0)
        stats = _torch_stats.memory_stats(0)
        self.assertEqual((stats["allocation"]["all"]["allocated"], stats["allocation"]["all"]["freed"]), (0, 0))
        _torch_stats.reset_peak_memory_stats(0)
        self.assertEqual(_torch_stats.memory_stats(0)["allocated_bytes"]["all"]["peak"], 4 * MiB)
        free(a)

    def test_patch_replaces_the_bindings_that_exist(self):
        fake_c = types.SimpleNamespace(_cuda_memoryStats=None, _cuda_resetPeakMemoryStats=None,
                                       _cuda_resetAccumulatedMemoryStats=None)
        replaced = _torch_stats.patch(types.SimpleNamespace(_C=fake_c))
        self.assertEqual(sorted(replaced), sorted(vars(fake_c)))
        self.assertIs(fake_c._cuda_memoryStats, _torch_stats.memory_stats)
        self.assertFalse(hasattr(fake_c, "_accelerator_getDeviceStats"), "patch() added a binding PyTorch lacks")


class FakeTorch:
    """Just enough of torch for install(): records the allocator it is given and its hooks."""

    def __init__(self):
        self.hooks = {}
        self.current = None
        self.initialized = False
        torch = self
        checkpoint = lambda *a: "pytorch's own"  # noqa: E731

        class Hooks:
            def __getattr__(self, name):
                if name != _process.MEMORY_FRACTION_HOOK[0]:
                    raise AttributeError(name)
                return lambda address: torch.hooks.__setitem__(name, address)

        class PluggableAllocator:
            def __init__(self, path, malloc, free_name):
                self.args = (path, malloc, free_name)
                self._hooks = Hooks()

            def allocator(self):
                return self._hooks

        def change(allocator):
            torch.current = allocator

        def empty_cache():  # PyTorch calls the reset hook; a C++ exception becomes a RuntimeError
            error = hook("empty_cache")
            if error:
                raise RuntimeError(error)

        class Graph:  # torch.cuda.graph's entry, as PyTorch writes it: synchronize, empty the cache
            fail_on_entry = False

            def __init__(self, cuda_graph=None, pool=None):
                self.pool = pool

            def __enter__(self):
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                if self.fail_on_entry:
                    raise RuntimeError("capture_begin failed")
                return self

            def __exit__(self, *exc):
                return False

        class Stream:  # a stream PyTorch made: its handle and device
            def __init__(self, handle):
                self.cuda_stream, self.device = handle.value, types.SimpleNamespace(index=0)

        class ExternalStream(Stream):
            pass

        class Event:  # the program's event: the fake's timeline hears its wait
            def record(self, stream=None):
                self.recorded_on = (stream or torch.cuda.current_stream()).cuda_stream

            def wait(self, stream=None):
                waiter = (stream or torch.cuda.current_stream()).cuda_stream
                fake.fake_program_wait(ctypes.c_void_p(waiter), ctypes.c_void_p(self.recorded_on))

        self.cuda = types.SimpleNamespace(
            is_initialized=lambda: torch.initialized, MemPool=object, use_mem_pool=object, graph=Graph,
            synchronize=lambda: None, empty_cache=empty_cache, Stream=Stream, ExternalStream=ExternalStream,
            Event=Event, current_stream=lambda: Stream(A),
            memory=types.SimpleNamespace(CUDAPluggableAllocator=PluggableAllocator, change_current_allocator=change))
        self._C = types.SimpleNamespace(_cuda_memoryStats=None, _cuda_resetPeakMemoryStats=None,
                                        _cuda_resetAccumulatedMemoryStats=None, _cuda_getMemoryFraction=None,
                                        _cuda_getCheckpointState=checkpoint,
                                        _cuda_setCheckpointPoolState=checkpoint)
        self.__version__ = "0.0-fake"


class FakeNative:
    """Stands in for the module build_native() compiles: records what install() asks of it."""

    def __init__(self):
        self.installs = []

    def install(self, address):
        self.installs.append(address)


@unittest.skipUnless(HOOKS, "the shim was built without its C++ part")
class Install(Base):
    def setUp(self):
        super().setUp()
        self.saved_torch = sys.modules.get("torch")
        self.torch = sys.modules["torch"] = FakeTorch()
        self.native = FakeNative()
        self.saved_build = _process.build_native
        _process.build_native = lambda verbose=False: self.native

    def tearDown(self):
        _process.build_native = self.saved_build
        _process._allocator = None
        _storage._default_kind = None
        _storage._allocators.clear()  # they were made by the stand-in torch
        if self.saved_torch is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = self.saved_torch
        super().tearDown()

    def address(self, symbol):
        return ctypes.cast(getattr(shim, symbol), ctypes.c_void_p).value

    def test_install_registers_the_native_allocator(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        vmmarena.install()
        self.assertTrue(vmmarena.installed())
        self.assertEqual(shim.vmm_torch_caching(), 1)
        # The module is told which copy of the library the package loaded (it checks its own link).
        self.assertEqual(self.native.installs, [self.address("vmm_torch_native_alloc")])
        self.assertIsNone(self.torch.current, "install() went through the pluggable allocator")
        self.assertIsNone(self.torch._C._cuda_memoryStats, "install() patched PyTorch's statistics bindings")
        vmmarena.install()  # a second call does nothing
        self.assertEqual(len(self.native.installs), 1)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.use_as_default()
        self.assertIn("install() already made vmmarena PyTorch's allocator", str(cm.exception))

    def test_the_programs_waits_order_reuse_across_streams(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        vmmarena.install()
        cuda = self.torch.cuda
        fake.fake_set_event_lag(10)  # the device stays behind: A's frees are pending
        fake.fake_advance_clock(1)
        ptr = take(4 * MiB, stream=A)
        free(ptr, stream=A)
        self.assertNotEqual(take(8 * MiB, stream=B), ptr, "a pending free served another stream")
        event = cuda.Event()  # the program's wait, as Stream.wait_stream makes it
        event.record(cuda.Stream(A))
        event.wait(cuda.Stream(B))
        waits = calls("cuStreamWaitEvent")
        self.assertEqual(take(4 * MiB, stream=B), ptr, "the program's wait did not order the reuse")
        self.assertEqual(calls("cuStreamWaitEvent"), waits, "a stream was made to wait")
        # An external stream is not heard: its handle may be made again.
        other = take(2 * MiB, stream=A)
        free(other, stream=A)
        event.record(cuda.ExternalStream(A))
        event.wait(cuda.Stream(B))
        self.assertNotEqual(take(2 * MiB, stream=B), other)
        self.assertTrue(cuda.Event.record._vmmarena_learns_order)
        vmmarena.install()  # a second call wraps nothing twice
        self.assertEqual(cuda.Event.record.__wrapped__.__name__, "record")

    def test_a_refused_registration_is_one_error_and_leaves_caching_off(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)

        def refuse(address):
            raise RuntimeError("vmmarena.install() must run before CUDA is initialized: PyTorch's allocator (native) is "
                               "in use already")

        self.native.install = refuse
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.install()
        self.assertIn("install(): vmmarena.install() must run before CUDA is initialized", str(cm.exception))
        self.assertFalse(vmmarena.installed())
        self.assertEqual(shim.vmm_torch_caching(), 0)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))

    def test_use_as_default_answers_the_statistics_and_the_memory_fraction(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)  # use_as_default() has no caching layer
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        vmmarena.use_as_default("package")
        self.assertEqual(self.torch.current.args, (_lib.loaded_path(), "vmm_torch_package_allocate", "vmm_torch_free"))
        self.assertEqual(self.torch.hooks, {"set_memory_fraction_fn": self.address("vmm_torch_process_memory_fraction")})
        self.assertIs(self.torch._C._cuda_memoryStats, _torch_stats.memory_stats)
        self.assertEqual(hook("memory_fraction", 0.5, 0), "")  # what PyTorch calls through that hook
        self.assertEqual(self.torch._C._cuda_getMemoryFraction(0), 0.5)

    def test_install_after_cuda_started_is_refused(self):
        self.torch.initialized = True
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.install()
        self.assertIn("must run before CUDA is initialized", str(cm.exception))
        self.assertFalse(vmmarena.installed())
        self.assertIsNone(self.torch.current)

    def test_install_with_a_bad_configuration_is_a_value_error(self):
        os.environ["VMMARENA_REUSE"] = "sometimes"
        with self.assertRaises(ValueError) as cm:
            vmmarena.install()
        self.assertIn('VMMARENA_REUSE="sometimes"', str(cm.exception))
        self.assertFalse(vmmarena.installed())

    def physical(self):
        return snap()["totals"]["physical_bytes"]

    def test_a_graphs_entry_keeps_the_cache_and_quiesces(self):
        vmmarena.install()
        fake.fake_set_event_lag(1000)  # the device never catches up on its own
        fake.fake_advance_clock(1)  # work from now on is behind
        try:
            free(take(8 * MiB, stream=A), stream=A)
            cached, before = self.physical(), snap()
            self.assertEqual(cached, 8 * MiB)
            with self.torch.cuda.graph():
                self.assertEqual(self.physical(), cached, "torch.cuda.graph's entry gave the cache back")
                self.assertEqual(calls("cuCtxSynchronize"), calls("cuCtxSynchronize", before) + 1,
                                 "the entry did not quiesce the device")
                # Quiesced, the free on A is known complete: a capture on B takes it, no new memory.
                graph, on_b = (11, 0), StreamFilter(B)
                self.assertEqual(begin(graph, on_b), "")
                ptr, error = hook_malloc(8 * MiB, stream=B)
                self.assertEqual(error, "")
                self.assertEqual(calls("cuMemCreate"), calls("cuMemCreate", before), "the capture created memory")
                free(ptr, stream=B)
                self.assertEqual(end(graph), "")
                release(graph)
        finally:
            fake.fake_set_event_lag(0)
        self.torch.cuda.empty_cache()  # the program's own call gives the cache back
        self.assertEqual(self.physical(), 0)

    def test_the_cache_is_kept_only_during_the_entry(self):
        vmmarena.install()
        graph = self.torch.cuda.graph()
        graph.fail_on_entry = True
        free(take(4 * MiB))
        with self.assertRaises(RuntimeError):
            with graph:
                pass
        self.assertEqual(self.physical(), 4 * MiB)
        self.torch.cuda.empty_cache()
        self.assertEqual(self.physical(), 0, "a failed entry left the cache kept")

    def test_graph_empty_cache_release_gives_the_cache_back_on_entry(self):
        os.environ[_process.GRAPH_EMPTY_CACHE] = "release"
        vmmarena.install()
        free(take(4 * MiB))
        with self.torch.cuda.graph():
            self.assertEqual(self.physical(), 0)
        self.assertFalse(hasattr(self.torch.cuda.graph.__enter__, "__wrapped__"))

    def test_a_bad_graph_empty_cache_value_is_a_value_error(self):
        os.environ[_process.GRAPH_EMPTY_CACHE] = "sometimes"
        with self.assertRaises(ValueError) as cm:
            vmmarena.install()
        self.assertIn('VMMARENA_GRAPH_EMPTY_CACHE="sometimes": expected keep or release', str(cm.exception))
        self.assertFalse(vmmarena.installed())

    def test_storage_contexts_set_the_threads_kind(self):
        vmmarena.install()
        storage = vmmarena.Storage(0)
        with storage.package():
            self.assertEqual(shim.vmm_torch_kind(), PACKAGE)
            weights = take(4 * MiB)
            with storage.transient(), storage.tag("step"):
                self.assertEqual(shim.vmm_torch_kind(), TRANSIENT)
                scratch = take(4 * MiB)
            self.assertEqual(shim.vmm_torch_kind(), PACKAGE)
        self.assertEqual(shim.vmm_torch_kind(), TRANSIENT)
        now = storage.snapshot()
        self.assertEqual(now["mode"], "process")
        self.assertNotIn("stray_transient", now)
        self.assertEqual(containing(weights, now)["kind"], "package")
        self.assertEqual((containing(scratch, now)["kind"], containing(scratch, now)["tag"]), ("transient", "step"))
        with self.assertRaises(KeyError):
            with storage.package():
                raise KeyError("the block failed")
        self.assertEqual(shim.vmm_torch_kind(), TRANSIENT, "an exception left the kind set")
        free(weights)
        free(scratch)

    def test_pause_takes_exactly_one_tags_tensors(self):
        vmmarena.install()
        storage = vmmarena.Storage(0)
        with storage.tag("a"):
            in_a = [take(64 * KiB) for _ in range(3)]
        with storage.tag("b"):
            in_b = take(64 * KiB)
        plain = take(64 * KiB)
        storage.pause("a")
        now = snap()
        self.assertEqual({containing(p, now)["state"] for p in in_a}, {"paused"})
        self.assertEqual(containing(in_b, now)["state"], "live")
        self.assertEqual(containing(plain, now)["state"], "live")
        storage.resume("a")
        self.assertEqual({containing(p, snap())["state"] for p in in_a}, {"live"})
        for ptr in in_a + [in_b, plain]:
            free(ptr)


@unittest.skipUnless(NATIVE, "the shim was built without its C++ part")
class NativeBookkeeping(Base):
    """What the native allocator class keeps in the shim: allocations, statistics, snapshot
    segments, pools and the checkpoints of cudagraph trees."""

    def test_the_stats_struct_matches(self):
        self.assertEqual(shim.vmm_torch_native_stats_size(), ctypes.sizeof(DeviceStats))

    def test_allocations_are_counted_in_pytorchs_terms(self):
        small, mid, large = native_take(4 * KiB), native_take(2 * MiB), native_take(6 * MiB + 5)
        s = native_stats()
        self.assertEqual([s.allocation[t].current for t in range(3)], [3, 1, 2])
        self.assertEqual(s.requested_bytes[0].current, 4 * KiB + 8 * MiB + 5)
        self.assertEqual(s.allocated_bytes[0].current, _lib.usage(0)["allocated_bytes"])
        self.assertEqual(s.reserved_bytes[0].current, _lib.usage(0)["reserved_bytes"])
        self.assertEqual(s.segment[0].current, 3, "three mappings: a page and two whole ones")
        self.assertEqual((s.segment[1].current, s.segment[2].current), (1, 2))
        self.assertEqual(s.max_split_size, -1)
        self.assertEqual(s.num_device_alloc, calls("cuMemCreate"))
        self.assertEqual(native_free(mid), (_lib.VMM_OK, ""))
        status, msg = native_free(mid)
        self.assertEqual(status, _lib.VMM_ERR_UNKNOWN_POINTER)
        self.assertIn("not a live allocation of vmmarena's native allocator", msg)
        s = native_stats()
        self.assertEqual((s.allocation[0].current, s.allocation[0].peak, s.allocation[0].allocated,
                          s.allocation[0].freed), (2, 3, 3, 1))
        self.assertEqual(shim.vmm_torch_native_reset_accumulated(0), _lib.VMM_OK)
        self.assertEqual(shim.vmm_torch_native_reset_peaks(0), _lib.VMM_OK)
        s = native_stats()
        self.assertEqual((s.allocation[0].current, s.allocation[0].peak, s.allocation[0].allocated), (2, 2, 0))
        self.assertEqual(s.allocated_bytes[0].peak, s.allocated_bytes[0].current)
        base, size, dev = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_int()
        self.assertEqual(shim.vmm_torch_native_lookup(large + 100, ctypes.byref(dev), ctypes.byref(base),
                                                      ctypes.byref(size)), _lib.VMM_OK)
        self.assertEqual((dev.value, base.value, size.value), (0, large, 6 * MiB + 5))
        for ptr in (small, large):
            self.assertEqual(native_free(ptr)[0], _lib.VMM_OK)
        self.assertEqual(native_stats().allocation[0].current, 0)

    def test_an_oom_counts_and_records_nothing(self):
        before = native_stats()
        out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
        status = shim.vmm_torch_native_alloc(1 << 50, 0, A, ctypes.byref(out), msg, len(msg))
        self.assertNotEqual(status, _lib.VMM_OK)
        self.assertIsNone(out.value)
        self.assertTrue(msg.value, "no message for the refusal")
        after = native_stats()
        self.assertEqual(after.allocation[0].current, before.allocation[0].current)

    def test_segments_tile_their_mappings_and_show_each_allocation(self):
        slots = [native_take(4 * KiB) for _ in range(3)]
        whole = native_take(6 * MiB)
        native_free(slots[1])
        segments = native_segments()
        self.assertEqual(len(segments), 2)
        for seg, blocks in segments:
            self.assertEqual(sum(b.size for b in blocks), seg.size, "the blocks do not tile the segment")
            self.assertEqual([b.address for b in blocks], sorted(b.address for b in blocks))
            self.assertEqual(blocks[0].address, seg.address)
        live = {b.address: b for _, blocks in segments for b in blocks if b.state == 1}
        self.assertEqual(set(live), {slots[0], slots[2], whole})
        self.assertEqual(live[whole].requested, 6 * MiB)
        page = next(seg for seg, _ in segments if seg.is_page)
        self.assertEqual(page.size, 2 * MiB)
        self.assertEqual(page.stream, A.value)
        total = sum(b.size for _, blocks in segments for b in blocks if b.state == 1)
        self.assertEqual(total, native_stats().allocated_bytes[0].current, "snapshot and memory_stats disagree")
        for ptr in (slots[0], slots[2], whole):
            native_free(ptr)

    def test_mempool_uses(self):
        pool = (0, 77)
        self.assertEqual(shim.vmm_torch_native_pool_uses(0, *pool), 0)
        self.assertEqual(hook("incref_pool", 0, *pool), "")  # torch.cuda.MemPool(): one use, no capture
        self.assertEqual(shim.vmm_torch_native_pool_uses(0, *pool), 1)
        self.assertEqual(shim.vmm_torch_process_captures(0, None), 0)
        self.assertIn("out of range", hook("incref_pool", 64, *pool))
        on_a = StreamFilter(A)
        self.assertEqual(begin(pool, on_a), "")  # use_mem_pool(pool)
        self.assertEqual(shim.vmm_torch_native_pool_uses(0, *pool), 2)
        ptr = native_take(6 * MiB, stream=A)
        self.assertEqual(live_equal(pool, [ptr]), 1)
        self.assertEqual(live_equal(pool, []), 0)
        self.assertEqual(end(pool), "")
        native_free(ptr)
        self.assertEqual(live_equal(pool, []), 1)
        segs = native_segments(pool)
        self.assertEqual([(s.pool_first, s.pool_second) for s, _ in segs], [pool], "the pool's cached mapping")
        self.assertEqual(release(pool), "")  # use_mem_pool's end
        self.assertEqual(shim.vmm_torch_native_pool_uses(0, *pool), 1)
        self.assertEqual(release(pool), "")  # ~MemPool
        self.assertEqual(shim.vmm_torch_native_pool_uses(0, *pool), 0)
        self.assertEqual(native_segments(pool), [], "a released pool still lists segments")

    def checkpoint(self, pool):
        out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
        status = shim.vmm_torch_native_checkpoint(0, pool[0], pool[1], ctypes.byref(out), msg, len(msg))
        self.assertEqual(status, _lib.VMM_OK, msg.value)
        return out.value

    def restore(self, state):
        freed, allocd = (ctypes.c_void_p * 16)(), (ctypes.c_void_p * 16)()
        n_freed, n_allocd, msg = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.create_string_buffer(1024)
        status = shim.vmm_torch_native_restore(state, freed, 16, ctypes.byref(n_freed), allocd, 16,
                                               ctypes.byref(n_allocd), msg, len(msg))
        self.assertEqual(status, _lib.VMM_OK, msg.value)
        return set(freed[:n_freed.value]), set(allocd[:n_allocd.value])

    def test_a_checkpoint_holds_what_it_lists_and_restores_it(self):
        pool, on_a = (5, 0), StreamFilter(A)
        self.assertEqual(begin(pool, on_a), "")  # the graph that keeps the pool alive
        a, b = native_take(4 * MiB, stream=A), native_take(2 * MiB, stream=A)
        state = self.checkpoint(pool)
        self.assertEqual(shim.vmm_torch_native_checkpoint_count(state), 2)
        # A path ends: a is freed, but the checkpoint lists it, so the arena keeps it.
        self.assertEqual(native_free(a)[0], _lib.VMM_OK)
        s = native_stats()
        self.assertEqual((s.held_count, s.held_bytes, s.allocation[0].current), (1, 4 * MiB, 1))
        self.assertEqual(containing(a)["state"], "live", "the held allocation went back to the arena")
        c = native_take(4 * MiB, stream=A)
        self.assertNotEqual(c, a, "a new allocation of the pool got memory a checkpoint holds")
        self.assertEqual(live_equal(pool, [b, c]), 1)
        # Restoring: c (not listed) is freed, a is live again at its address, b stays.
        freed, allocd = self.restore(state)
        self.assertEqual((freed, allocd), ({b, c}, {a, b}))
        self.assertEqual(live_equal(pool, [a, b]), 1)
        self.assertEqual(native_stats().held_count, 0)
        self.assertEqual(native_free(a)[0], _lib.VMM_OK)  # held again: the checkpoint still lists it
        self.assertEqual(native_stats().held_count, 1)
        shim.vmm_torch_native_checkpoint_drop(state)  # the last checkpoint: a goes back
        self.assertEqual(native_stats().held_count, 0)
        self.assertEqual(containing(a)["state"], "pooled")
        native_free(b)
        self.assertEqual(end(pool), "")
        self.assertEqual(release(pool), "")

    def test_a_checkpoint_of_an_unknown_pool_is_refused(self):
        out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
        status = shim.vmm_torch_native_checkpoint(0, 123, 0, ctypes.byref(out), msg, len(msg))
        self.assertEqual(status, _lib.VMM_ERR_INVALID_ARGUMENT)
        self.assertIn("pool (123, 0) of device 0 is not in use", msg.value.decode())


class NativeBuild(unittest.TestCase):
    """build_native()'s checks, which need no compiler to test."""

    def ext(self, **kw):
        return types.SimpleNamespace(**dict({"CUDA_HOME": "/usr/local/cuda", "is_ninja_available": lambda: True}, **kw))

    def torch(self, version="2.11.0+cu130", cuda="13.0"):
        return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda))

    def test_another_pytorch_is_one_line_saying_which(self):
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            _process._check_buildable(self.torch("2.10.1"), self.ext())
        self.assertIn("PyTorch 2.10.1: vmmarena's native allocator is written for the allocator interface of "
                      "PyTorch 2.11", str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))

    def test_no_compiler_ninja_or_cuda_headers(self):
        saved = os.environ.get("CXX")
        os.environ["CXX"] = "/nonexistent/c++"
        try:
            with self.assertRaises(vmmarena.VmmarenaError) as cm:
                _process._check_buildable(self.torch(), self.ext())
            self.assertIn("needs a C++ compiler and '/nonexistent/c++' is not on PATH", str(cm.exception))
        finally:
            if saved is None:
                del os.environ["CXX"]
            else:
                os.environ["CXX"] = saved
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            _process._check_buildable(self.torch(), self.ext(CUDA_HOME=None))
        self.assertIn("CUDA toolkit's headers", str(cm.exception))

    def test_the_sources_are_found_and_the_cache_key_follows_them(self):
        source, include = _process.native_sources()
        self.assertTrue(source.endswith("vmmarena_allocator.cpp"))
        key = _process._cache_key(self.torch(), source, include)
        self.assertNotEqual(key, _process._cache_key(self.torch("2.11.1"), source, include))
        os.environ[_process.NATIVE_CACHE] = "/tmp/vmmarena-native-test"
        try:
            self.assertEqual(_process.native_cache_dir(), "/tmp/vmmarena-native-test")
        finally:
            del os.environ[_process.NATIVE_CACHE]


class WithoutTorch(Base):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed here")
    def test_install_says_that_it_needs_torch(self):
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.install()
        self.assertIn("PyTorch is needed", str(cm.exception))
        self.assertFalse(vmmarena.installed())


if __name__ == "__main__":
    unittest.main()
