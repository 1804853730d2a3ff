"""CI tests of libvmmarena_torch.so on the fake driver (no GPU, no torch), through ctypes and
the vmmarena package.

Environment (set by the python_shim CMake test): VMMARENA_LIBRARY = the shim,
VMMARENA_FAKE_DRIVER = libvmmarena_fake_driver.so, PYTHONPATH = shim/python. tests/wheel-check
runs it with neither VMMARENA_LIBRARY nor PYTHONPATH, against a pip-installed package.
"""

import ctypes
import importlib.util
import os
import re
import sys
import unittest

TORCH_LOADED_BEFORE = "torch" in sys.modules
import vmmarena  # noqa: E402
from vmmarena import _lib  # noqa: E402

import fake_driver  # noqa: E402

MiB = 1 << 20
STREAM = ctypes.c_void_p(0x5001)
OTHER_STREAM = ctypes.c_void_p(0x5002)

shim = _lib.lib()
fake = fake_driver.load()


def package_alloc(size, device=0, stream=STREAM):
    return shim.vmm_torch_package_allocate(size, device, stream)


def transient_alloc(size, device=0, stream=STREAM):
    return shim.vmm_torch_transient_allocate(size, device, stream)


def free(ptr, size=0, device=0, stream=STREAM):
    shim.vmm_torch_free(ptr, size, device, stream)


def mapping_at(snap, ptr):
    found = [m for m in snap["mappings"] if int(m["base"], 16) == ptr]
    return found[0] if found else None


class ShimOnFakeDriver(unittest.TestCase):
    def setUp(self):
        self.saved_env = fake_driver.clear_settings()
        shim.vmm_torch_set_driver_for_testing(None)  # drops arenas of the previous fake
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))

    def tearDown(self):
        shim.vmm_torch_set_driver_for_testing(None)  # destroys every arena on the fake
        fake_driver.restore_settings(self.saved_env)
        first = fake.fake_first_error()
        self.assertEqual(fake.fake_ledger_clean(), 1, f"fake ledger not clean: {first}")

    # ---- Loading ------------------------------------------------------------------------

    def test_import_does_not_import_torch(self):
        if TORCH_LOADED_BEFORE:
            self.skipTest("torch was imported before vmmarena")
        self.assertNotIn("torch", sys.modules)

    def test_missing_library_path_is_named(self):
        saved = os.environ.get("VMMARENA_LIBRARY")  # unset when testing an installed package
        os.environ["VMMARENA_LIBRARY"] = "/nonexistent/libvmmarena_torch.so"
        try:
            with self.assertRaises(vmmarena.VmmarenaError) as cm:
                vmmarena.library_path()
            self.assertIn("/nonexistent/libvmmarena_torch.so", str(cm.exception))
        finally:
            if saved is None:
                del os.environ["VMMARENA_LIBRARY"]
            else:
                os.environ["VMMARENA_LIBRARY"] = saved

    def test_only_torch_entry_points_are_exported(self):
        for hidden in ("vmm_arena_create", "vmm_arena_alloc", "vmm_config_from_env", "vmm_trace_reader_open"):
            with self.assertRaises(AttributeError, msg=hidden):
                getattr(shim, hidden)

    def test_status_codes_come_from_the_library(self):
        codes = _lib.status_codes()
        self.assertEqual(codes["VMM_OK"], 0)  # the one value the API fixes
        self.assertEqual(list(codes.values()), list(range(len(codes))))
        self.assertGreaterEqual(len(codes), 7)
        for name, value in codes.items():
            self.assertEqual(getattr(_lib, name), value)
            self.assertEqual(_lib.status_name(value), name)
        self.assertEqual(_lib.status_name(len(codes)), "VMM_STATUS_UNKNOWN")
        with self.assertRaises(AttributeError):
            _lib.VMM_ERR_NO_SUCH_STATUS  # noqa: B018
        with open(_lib.__file__) as f:
            written = re.findall(r"^(VMM_\w+) *= *\d", f.read(), re.MULTILINE)
        self.assertEqual(written, [], "status codes written into the package instead of read from the library")

    def test_trace_reader_through_the_shim(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.trace")
            with open(path, "w") as f:
                f.write("vmmtrace 1\n# c\n7 alloc transient 5 2097152 0x7f0000000000 0x5001 a%20b VMM_OK\n"
                        "9 free - 0 0 0x1000 0x0 - VMM_ERR_UNKNOWN_POINTER\n")
            with _lib.TraceReader(path) as reader:
                self.assertEqual((reader.name, reader.records), (path, 2))
                got = [(line, r.t_ns, r.op, r.kind, r.requested, r.rounded, r.ptr, r.stream, r.tag, r.result)
                       for line, r in reader]
            self.assertEqual(got, [(3, 7, 0, 1, 5, 2097152, 0x7F0000000000, 0x5001, b"a b", _lib.VMM_OK),
                                   (4, 9, 1, -1, 0, 0, 0x1000, 0, b"", _lib.VMM_ERR_UNKNOWN_POINTER)])
            with open(path, "a") as f:
                f.write("10 allc\n")
            with self.assertRaises(_lib.TraceFileError) as cm:
                _lib.TraceReader(path)
            self.assertEqual(cm.exception.message, f"{path}: line 5: 2 fields, expected 9 (time, operation, kind, "
                             "requested, rounded, pointer, stream, tag, result)")
            self.assertEqual(cm.exception.status_name, "VMM_ERR_INVALID_ARGUMENT")
            self.assertIsInstance(cm.exception, ValueError)

    # ---- Configuration ------------------------------------------------------------------

    def test_bad_configuration_is_reported_not_defaulted(self):
        os.environ["VMMARENA_LIMIT"] = "lots"
        buf = ctypes.create_string_buffer(1024)
        status = shim.vmm_torch_config_check(buf, len(buf))
        self.assertEqual(status, _lib.VMM_ERR_INVALID_ARGUMENT)
        self.assertIn('VMMARENA_LIMIT="lots"', buf.value.decode())
        self.assertIsNone(package_alloc(4096))
        self.assertIn('VMMARENA_LIMIT="lots"', vmmarena.last_error(0))
        # Creation is retried: once the value is fixed, the next allocation works.
        os.environ["VMMARENA_LIMIT"] = "64M"
        ptr = package_alloc(4096)
        self.assertIsNotNone(ptr)
        self.assertEqual(vmmarena.snapshot(0)["limit_bytes"], 64 * MiB)
        free(ptr, 4096)

    def test_bad_configuration_raises_value_error(self):
        os.environ["VMMARENA_REUSE"] = "sometimes"
        with self.assertRaises(ValueError) as cm:
            vmmarena.Storage(0)
        self.assertIsInstance(cm.exception, vmmarena.VmmarenaError)
        self.assertIn('VMMARENA_REUSE="sometimes"', str(cm.exception))
        self.assertEqual(cm.exception.status_name, "VMM_ERR_INVALID_ARGUMENT")
        with self.assertRaises(vmmarena.VmmarenaConfigError):
            vmmarena.config_check()

    def test_good_configuration_reaches_the_arena(self):
        os.environ.update(VMMARENA_REUSE="bounded:2", VMMARENA_RETAIN="on", VMMARENA_HEADROOM="1G")
        snap = vmmarena.Storage(0).snapshot()
        self.assertEqual(snap["reuse"]["policy"], "bounded")
        self.assertEqual(snap["reuse"]["bound"], 2)
        self.assertEqual(snap["retention"]["mode"], "on")
        self.assertEqual(snap["headroom_bytes"], 1 << 30)

    # ---- Allocation and free ------------------------------------------------------------

    def test_snapshot_round_trip(self):
        storage = vmmarena.Storage(0)
        ptr = package_alloc(3 * MiB)
        self.assertIsNotNone(ptr)
        snap = storage.snapshot()
        m = mapping_at(snap, ptr)
        self.assertIsNotNone(m, snap["mappings"])
        self.assertEqual((m["extent"], m["requested"], m["kind"], m["state"]), (4 * MiB, 3 * MiB, "package", "live"))
        self.assertEqual(snap["kinds"]["package"]["live_bytes"], 4 * MiB)
        self.assertEqual(snap["totals"]["physical_bytes"], 4 * MiB)
        self.assertEqual(snap["stray_transient"]["count"], 0)
        free(ptr, 3 * MiB)
        snap = storage.snapshot()
        self.assertEqual(snap["mappings"], [])
        self.assertEqual((snap["totals"]["physical_bytes"], snap["totals"]["frees"]), (0, 1))
        storage.check()

    def test_snapshot_into_a_small_buffer_fails_with_sizes(self):
        self.assertIsNotNone(_lib.snapshot_json(0))
        buf = ctypes.create_string_buffer(16)
        self.assertEqual(shim.vmm_torch_snapshot_json(0, buf, len(buf)), _lib.VMM_ERR_INVALID_ARGUMENT)
        self.assertIn("bytes needed, buffer holds 16", vmmarena.last_error(0))
        self.assertEqual(len(buf.value), 15)

    def test_free_of_unknown_or_interior_pointer_keeps_the_error(self):
        ptr = package_alloc(4 * MiB)
        free(ptr + 4096, 4 * MiB)
        self.assertIn("interior pointer, 4096 bytes into the package allocation", vmmarena.last_error(0))
        free(0xDEAD0000, 64)
        self.assertIn("not an allocation of the arena of device 0", vmmarena.last_error(0))
        self.assertEqual(mapping_at(vmmarena.snapshot(0), ptr)["state"], "live")
        free(ptr, 4 * MiB)
        free(ptr, 4 * MiB)  # a second free
        self.assertIn(f"free(0x{ptr:x})", vmmarena.last_error(0))
        self.assertEqual(vmmarena.snapshot(0)["totals"]["frees"], 1)

    def test_free_before_any_arena(self):
        free(0x7F0000000000, 4096, device=3)
        self.assertIn("device 3 has no arena", vmmarena.last_error(3))
        free(None, 0)  # NULL is a no-op
        self.assertEqual(vmmarena.last_error(0), "")

    def test_zero_and_negative_sizes(self):
        self.assertIsNone(package_alloc(0))
        self.assertEqual(vmmarena.last_error(0), "")
        self.assertIsNone(transient_alloc(-5))
        self.assertIn("negative size -5", vmmarena.last_error(0))

    def test_devices(self):
        self.assertIsNone(package_alloc(4096, device=1))  # the fake has one device
        self.assertIn("device 1 not present: the driver reports 1 device(s)", vmmarena.last_error(1))
        self.assertIsNone(package_alloc(4096, device=99))
        self.assertIn("out of range", vmmarena.last_error(99))
        with self.assertRaises(ValueError):
            vmmarena.Storage(64)
        self.assertEqual(vmmarena.Storage("cuda:0").device, 0)

    def test_raw_entry_points_reject_bad_arguments(self):
        invalid = _lib.VMM_ERR_INVALID_ARGUMENT
        buf = ctypes.create_string_buffer(256)
        for device in (-1, 64):
            self.assertIsNone(package_alloc(4096, device=device))
            free(0x7F0000000000, 4096, device=device)  # no arena can own it: ignored
            for name in ("retention_begin", "retention_finish", "retention_abort", "quiesce"):
                self.assertEqual(getattr(shim, "vmm_torch_" + name)(device), invalid, name)
            self.assertEqual(shim.vmm_torch_snapshot_json(device, buf, len(buf)), invalid)
            self.assertEqual(shim.vmm_torch_snapshot_json_size(device), 0)
            self.assertEqual(shim.vmm_torch_check(device, buf, len(buf)), invalid)
            self.assertIn(b"out of range", shim.vmm_torch_last_error(device))
        self.assertEqual(shim.vmm_torch_snapshot_json(0, None, 64), invalid)
        self.assertEqual(shim.vmm_torch_snapshot_json(0, buf, 0), invalid)
        # Without a message buffer the checks still answer.
        self.assertEqual(shim.vmm_torch_config_check(None, 0), _lib.VMM_OK)
        self.assertEqual(shim.vmm_torch_check(0, None, 0), _lib.VMM_OK)
        untouched = ctypes.create_string_buffer(b"untouched", 16)
        self.assertEqual(shim.vmm_torch_config_check(untouched, 0), _lib.VMM_OK)
        self.assertEqual(shim.vmm_torch_check(0, untouched, 0), _lib.VMM_OK)
        self.assertEqual(untouched.value, b"untouched")

    def test_free_with_a_negative_size_is_refused(self):
        ptr = package_alloc(4 * MiB)
        free(ptr, -1)
        self.assertIn(f"free(0x{ptr:x}): negative size -1", vmmarena.last_error(0))
        self.assertEqual(mapping_at(vmmarena.snapshot(0), ptr)["state"], "live")
        free(ptr, 4 * MiB)
        self.assertEqual(vmmarena.snapshot(0)["mappings"], [])

    def test_bad_configuration_fails_every_entry_point(self):
        os.environ["VMMARENA_LIMIT"] = "lots"
        invalid = _lib.VMM_ERR_INVALID_ARGUMENT
        buf = ctypes.create_string_buffer(b"stale", 256)
        self.assertEqual(shim.vmm_torch_retention_begin(0), invalid)
        self.assertIn('VMMARENA_LIMIT="lots"', vmmarena.last_error(0))
        self.assertEqual(shim.vmm_torch_snapshot_json(0, buf, len(buf)), invalid)
        self.assertEqual(buf.value, b"")
        self.assertEqual(shim.vmm_torch_snapshot_json_size(0), 0)
        self.assertEqual(shim.vmm_torch_check(0, buf, len(buf)), invalid)

    def test_out_of_memory_message_has_the_numbers(self):
        os.environ["VMMARENA_LIMIT"] = "8M"
        kept = package_alloc(6 * MiB)
        self.assertIsNone(package_alloc(4 * MiB))
        message = vmmarena.last_error(0)
        self.assertIn("limit 8.0 MiB < 6.0 MiB held + 4.0 MiB requested", message)
        self.assertIn("requested 4194304 B", message)
        self.assertEqual(vmmarena.snapshot(0)["fatal_error"], None)
        free(kept, 6 * MiB)

    # ---- Retention scope ----------------------------------------------------------------

    def test_scope_errors_raise_with_the_message(self):
        storage = vmmarena.Storage(0)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            storage.retention_finish()
        self.assertEqual(cm.exception.status_name, "VMM_ERR_SCOPE_STATE")
        self.assertIn("vmm_retention_finish: no retention scope is active (0 begun", cm.exception.message)
        with self.assertRaises(vmmarena.VmmarenaError) as cm:
            storage.retention_abort()
        self.assertIn("vmm_retention_abort: no retention scope is active", str(cm.exception))
        with storage.retain_transient_backing():
            with self.assertRaises(vmmarena.VmmarenaError) as cm:
                with storage.retain_transient_backing():
                    pass
            self.assertIn("already active; scopes do not nest", cm.exception.message)
        self.assertEqual(storage.snapshot()["scope"]["finished"], 1)

    def test_retention_reuses_and_finish_releases(self):
        os.environ["VMMARENA_RETAIN"] = "on"
        storage = vmmarena.Storage(0)
        with storage.retain_transient_backing():
            first = transient_alloc(8 * MiB)
            free(first, 8 * MiB)
            snap = storage.snapshot()
            self.assertEqual(snap["pool"]["retained_reusable_bytes"], 8 * MiB)
            self.assertEqual(snap["kinds"]["transient"]["pooled_count"], 1)
            self.assertEqual(snap["stray_transient"]["count"], 0)
            again = transient_alloc(8 * MiB)
            self.assertEqual(again, first)
            self.assertEqual(storage.snapshot()["pool"]["hits"], 1)
            free(again, 8 * MiB)
            kept = transient_alloc(2 * MiB)
        snap = storage.snapshot()
        self.assertEqual(snap["scope"]["state"], "none")
        self.assertEqual(snap["scope"]["finished"], 1)
        self.assertEqual(snap["pool"]["retained_reusable_handles"], 0)
        # A transient mapping alive outside any step is reported as a stray.
        self.assertEqual(snap["stray_transient"]["count"], 1)
        self.assertEqual(snap["stray_transient"]["mappings"][0]["base"], f"0x{kept:x}")
        self.assertEqual(snap["totals"]["physical_bytes"], 2 * MiB)
        free(kept, 2 * MiB)
        self.assertEqual(storage.snapshot()["totals"]["physical_bytes"], 0)

    def test_retention_aborts_on_exception_and_it_propagates(self):
        os.environ["VMMARENA_RETAIN"] = "on"
        storage = vmmarena.Storage(0)
        with self.assertRaises(KeyError):
            with storage.retain_transient_backing():
                free(transient_alloc(4 * MiB), 4 * MiB)
                raise KeyError("catalog failed")
        snap = storage.snapshot()
        self.assertEqual((snap["scope"]["state"], snap["scope"]["aborted"]), ("none", 1))
        self.assertEqual(snap["kinds"]["transient"]["abandoned_bytes"], 4 * MiB)

    def test_reuse_on_another_stream(self):
        os.environ["VMMARENA_RETAIN"] = "on"
        storage = vmmarena.Storage(0)
        with storage.retain_transient_backing():
            ptr = transient_alloc(4 * MiB, stream=STREAM)
            free(ptr, 4 * MiB, stream=STREAM)
            self.assertEqual(transient_alloc(4 * MiB, stream=OTHER_STREAM), ptr)
            self.assertGreaterEqual(storage.snapshot()["driver"]["cuStreamWaitEvent"]["calls"], 1)
            free(ptr, 4 * MiB, stream=OTHER_STREAM)

    # ---- Tags ---------------------------------------------------------------------------

    def test_tag_labels_new_segments(self):
        storage = vmmarena.Storage(0)
        with storage.tag("prefill"):
            tagged = package_alloc(2 * MiB)
        plain = package_alloc(2 * MiB)
        snap = storage.snapshot()
        self.assertEqual(mapping_at(snap, tagged)["tag"], "prefill")
        self.assertIsNone(mapping_at(snap, plain)["tag"])
        self.assertIn({"tag": "prefill", "count": 1, "bytes": 2 * MiB, "paused_count": 0, "paused_bytes": 0}, snap["tags"])
        with self.assertRaises(TypeError):
            with storage.tag(5):
                pass
        free(tagged)
        free(plain)

    # ---- Pause and resume ---------------------------------------------------------------

    def test_pause_and_resume_keep_the_address(self):
        storage = vmmarena.Storage(0)
        with storage.tag("operands"):
            ptr = package_alloc(4 * MiB)
        before = storage.snapshot()["totals"]["physical_bytes"]
        with storage.paused("operands", backup=True):
            snap = storage.snapshot()
            self.assertEqual(mapping_at(snap, ptr)["state"], "paused")
            self.assertEqual(snap["totals"]["physical_bytes"], before - 4 * MiB)
            self.assertIn({"tag": "operands", "count": 0, "bytes": 0, "paused_count": 1, "paused_bytes": 4 * MiB},
                          snap["tags"])
        snap = storage.snapshot()
        self.assertEqual(mapping_at(snap, ptr)["state"], "live")
        self.assertEqual(snap["totals"]["physical_bytes"], before)
        free(ptr)

    def test_pause_errors_raise_with_the_message(self):
        storage = vmmarena.Storage(0)
        with self.assertRaises(vmmarena.VmmarenaError) as caught:
            storage.pause("never used")
        self.assertEqual(caught.exception.status_name, "VMM_ERR_INVALID_ARGUMENT")
        self.assertIn('pause("never used"): no allocation was ever tagged so; nothing changed', str(caught.exception))
        with storage.tag("kv"):
            ptr = package_alloc(2 * MiB)
        with self.assertRaises(vmmarena.VmmarenaError) as caught:
            storage.resume("kv")
        self.assertIn("nothing is paused (1 live allocation(s) carry the tag)", str(caught.exception))
        with self.assertRaises(TypeError):
            storage.pause(3)
        with self.assertRaises(vmmarena.VmmarenaError) as caught:
            storage.pause(None)  # untagged: nothing live carries no tag here
        self.assertIn("pause(untagged): no live or paused allocation carries the tag", str(caught.exception))
        free(ptr)

    def test_paused_resumes_when_the_block_raises(self):
        storage = vmmarena.Storage(0)
        with storage.tag("w"):
            ptr = package_alloc(2 * MiB)
        with self.assertRaises(KeyError):
            with storage.paused("w"):
                raise KeyError("phase failed")
        self.assertEqual(mapping_at(storage.snapshot(), ptr)["state"], "live")
        free(ptr)

    # ---- Without torch ------------------------------------------------------------------

    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed here")
    def test_pools_say_that_they_need_torch(self):
        storage = vmmarena.Storage(0)
        for context in (storage.package, storage.transient):
            with self.assertRaises(vmmarena.VmmarenaError) as cm:
                with context():
                    pass
            self.assertIn("PyTorch is needed", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
