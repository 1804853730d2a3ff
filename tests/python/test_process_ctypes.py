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
        # ... with it the reuse waits for stream B's work.
        self.assertEqual(shim.vmm_torch_record_stream(ptr, B, msg, len(msg)), _lib.VMM_OK, msg.value)
        free(ptr)
        self.assertEqual(take(4 * MiB), ptr)
        self.assertGreater(calls("cuStreamWaitEvent"), waits, "the reuse did not wait for the recorded stream")
        free(ptr)

    def test_reuse_on_another_stream_waits_for_an_event(self):
        ptr = take(4 * MiB, stream=A)
        free(ptr, stream=A)
        before = snap()
        self.assertEqual(take(4 * MiB, stream=B), ptr)
        after = snap()
        self.assertGreater(calls("cuStreamWaitEvent", after), calls("cuStreamWaitEvent", before))
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
                if name not in _process.HOOKS:
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

        self.cuda = types.SimpleNamespace(
            is_initialized=lambda: torch.initialized, MemPool=object, use_mem_pool=object, graph=Graph,
            synchronize=lambda: None, empty_cache=empty_cache,
            memory=types.SimpleNamespace(CUDAPluggableAllocator=PluggableAllocator, change_current_allocator=change))
        self._C = types.SimpleNamespace(_cuda_memoryStats=None, _cuda_resetPeakMemoryStats=None,
                                        _cuda_resetAccumulatedMemoryStats=None, _cuda_getMemoryFraction=None,
                                        _cuda_getCheckpointState=checkpoint,
                                        _cuda_setCheckpointPoolState=checkpoint)
        self.__version__ = "0.0-fake"


@unittest.skipUnless(HOOKS, "the shim was built without its C++ part")
class Install(Base):
    def setUp(self):
        super().setUp()
        self.saved_torch = sys.modules.get("torch")
        self.torch = sys.modules["torch"] = FakeTorch()

    def tearDown(self):
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

    def test_install_sets_every_hook_and_the_statistics(self):
        shim.vmm_torch_set_driver_for_testing(None)
        _lib.set_caching(False)
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        vmmarena.install()
        self.assertTrue(vmmarena.installed())
        self.assertEqual(shim.vmm_torch_caching(), 1)
        allocator = self.torch.current
        self.assertEqual(allocator.args, (_lib.loaded_path(), "vmm_torch_process_malloc", "vmm_torch_free"))
        self.assertEqual(self.torch.hooks, {setter: self.address(symbol) for setter, symbol in _process.HOOKS.items()})
        self.assertIs(self.torch._C._cuda_memoryStats, _torch_stats.memory_stats)
        self.assertEqual(self.torch._C._cuda_getMemoryFraction(0), 1.0)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            self.torch._C._cuda_getCheckpointState(0, (1, 0))
        self.assertIn("mode='reduce-overhead'", str(cm.exception))
        vmmarena.install()  # a second call does nothing
        self.assertIs(self.torch.current, allocator)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.use_as_default()
        self.assertIn("install() already made vmmarena PyTorch's allocator", str(cm.exception))

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


class WithoutTorch(Base):
    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed here")
    def test_install_says_that_it_needs_torch(self):
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            vmmarena.install()
        self.assertIn("PyTorch is needed", str(cm.exception))
        self.assertFalse(vmmarena.installed())


if __name__ == "__main__":
    unittest.main()
