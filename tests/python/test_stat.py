"""`python3 -m vmmarena stat`: the tables of the committed sample snapshot (written by a real
arena on the fake driver), the same from standard input, exit status 2 with a clear message for
each kind of bad input, and a snapshot written just now by the shim (when the CMake test gives
the shim and the fake driver).

Environment: PYTHONPATH = shim/python (or an installed vmmarena).
"""

import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from vmmarena import _stat

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "..", "data", "snapshot-sample.json")


def run_stat(*args, stdin=None):
    """(exit status, stdout, stderr) of the command."""
    r = subprocess.run([sys.executable, "-m", "vmmarena", "stat", *args], input=stdin, capture_output=True)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


class Sample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SAMPLE, "rb") as f:
            cls.text = f.read()
        cls.rc, cls.shown, cls.err = run_stat(SAMPLE)

    def test_every_section_with_its_figures(self):
        self.assertEqual(self.rc, 0, self.err)
        expected = [
            r"vmmarena snapshot \(schema version 3\): device 0, discrete GPU",
            r"retention on \(mode on\); reuse exact; handle bound 64.0 MiB; package assembly on; granularity 2.0 MiB",
            r"headroom 2.0 GiB; limit 64.0 GiB",
            r"physical +16.2 GiB +16.2 GiB",
            r"reserved VA +256.0 GiB in 1 reservation\n",
            r"operations +16 allocs, 5 frees, 0 deferred frees",
            r"package +7 / 14.1 GiB +0 / 0 B +1 / 32.0 MiB +0 / 0 B +0 / 0 B\n",
            r"transient +4 / 1.4 GiB +2 / 736.0 MiB +0 / 0 B +0 / 0 B +0 / 0 B\n",
            r"reusable +3 handles \(768.0 MiB\): 1 idle \(32.0 MiB\), the rest in pooled mappings in 2 buckets",
            r"hits 2, misses 7, hit rate 22.2%, fallbacks 0, assemblies 3 \(0 padded, 5 idle handles, 192.0 MiB created, "
            r"1 pooled mappings taken apart\)",
            r"bucket +96.0 MiB x 1\n +bucket +640.0 MiB x 1\n",
            r"out of memory 0, limit 2, headroom 0",
            r"active \(id 1\); begun 1, finished 0, aborted 0",
            # tags, largest first, "no tag" last
            r"kv-cache +8.0 GiB +1 allocation\n +weights +6.0 GiB +5 allocations\n +warmup bs=16 +1.4 GiB +3 allocations\n",
            r" +graph operands +64.0 MiB +1 allocation\n +\(no tag\) +2.0 MiB +1 allocation\n",
            r"cuMemUnmap +2 +1 +0.001 +0.36\n",
            r"all +104 +1 +0.012\n",
            r"VMM_ERR_DRIVER: unmapping package 256.0 MiB at 0x7f3e91400000: cuMemUnmap returned "
            r"CUDA_ERROR_ILLEGAL_ADDRESS \(700\)",
            r"package 60.0 GiB refused \(requested 64424509440 B, rounded 64424509440 B\): limit 64.0 GiB",
            r"Inventory: 13 mappings, 16.2 GiB\n",
            r"package +live +7 +14.1 GiB\n +transient +live +4 +1.4 GiB\n +transient +pooled +2 +736.0 MiB\n",
            r"Largest 10:",
            r"0x7f3c7fe00000 +8.0 GiB +8.0 GiB +package +live +1 +0 +kv-cache\n",
            r"0x7f3c57e00000 +640.0 MiB +640.0 MiB +transient +pooled +1 +1 +warmup bs=8\n",
        ]
        for pattern in expected:
            self.assertRegex(self.shown, pattern)
        self.assertEqual(len(re.findall(r"\n  0x7f", self.shown)), 10, "the largest 10 inventory rows")
        self.assertEqual(self.err, "")

    def test_version_2_names(self):
        """A version-2 snapshot (the idle tier called "retained" and "idle_unmapped") shows the same tables."""
        doc = json.loads(self.text)
        doc["version"] = 2
        for stats in doc["kinds"].values():
            stats["retained_count"] = stats.pop("idle_count")
            stats["retained_bytes"] = stats.pop("idle_bytes")
        doc["pool"]["idle_unmapped_handles"] = doc["pool"].pop("idle_handles")
        doc["pool"]["idle_unmapped_bytes"] = doc["pool"].pop("idle_bytes")
        rc, shown, err = run_stat(stdin=json.dumps(doc).encode())
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(shown, self.shown.replace("(schema version 3)", "(schema version 2)"))

    def test_retired_ranges_in_versions_3_and_4(self):
        """Version 3 named pool.ranges_handed_to_retiring "pooled_taken_apart_early"; both show one line."""
        line = "\n  retired   5 ranges handed to the retiring list, 2 on it now (8.0 MiB)\n"
        v3 = json.loads(self.text)
        v3["pool"].update(pooled_taken_apart_early=5, retiring_ranges=2, retiring_bytes=8 << 20)
        rc, shown_v3, err = run_stat(stdin=json.dumps(v3).encode())
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("(schema version 3)", shown_v3)
        self.assertIn(line, shown_v3)
        v4 = json.loads(self.text)
        v4["version"] = 4
        v4["pool"].update(ranges_handed_to_retiring=5, retiring_ranges=2, retiring_bytes=8 << 20)
        rc, shown_v4, err = run_stat(stdin=json.dumps(v4).encode())
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(shown_v4, shown_v3.replace("(schema version 3)", "(schema version 4)"))
        self.assertNotIn("retired", self.shown)  # none retired: no line
        v4["pool"]["pooled_taken_apart_early"] = v4["pool"].pop("ranges_handed_to_retiring")
        self.assertNotIn("retired", _stat.render(v4))  # the old name is no key of version 4
        v4["pool"]["ranges_handed_to_retiring"] = "5"
        with self.assertRaisesRegex(_stat.SnapshotError, r'snapshot key "pool.ranges_handed_to_retiring" is a string'):
            _stat.render(v4)

    def test_standard_input(self):
        self.assertEqual(run_stat("-", stdin=self.text)[:2], (0, self.shown))
        self.assertEqual(run_stat(stdin=self.text)[:2], (0, self.shown))

    def test_format_snapshot_matches_the_command(self):
        import vmmarena

        self.assertEqual(vmmarena.format_snapshot(json.loads(self.text)), self.shown)

    def test_bounded_and_package_assembly_off(self):
        doc = json.loads(self.text)
        doc["reuse"].update(policy="bounded", bound=1.5, package_assembly=False)
        self.assertIn("reuse bounded:1.5; handle bound 64.0 MiB; package assembly off;", _stat.render(doc))
        doc["limit_bytes"] = 0
        self.assertIn("limit none", _stat.render(doc))

    def test_refill_shown_only_when_set(self):
        doc = json.loads(self.text)
        self.assertNotIn("refill", _stat.render(doc))  # the sample predates the key: assemble first
        doc["reuse"]["refill_share"] = 0.9
        self.assertIn("granularity 2.0 MiB; refill below-peak:0.9", _stat.render(doc))
        doc["reuse"]["refill_share"] = 0
        doc["reuse"]["refill_live_share"] = 1.05
        self.assertIn("granularity 2.0 MiB; refill within-live:1.05", _stat.render(doc))
        self.assertNotIn("below-peak", _stat.render(doc))
        doc["reuse"]["refill_share"] = "0.9"
        with self.assertRaisesRegex(_stat.SnapshotError, r'snapshot key "reuse.refill_share" is a string'):
            _stat.render(doc)

    def test_paused_allocations_of_a_tag(self):
        doc = json.loads(self.text)
        tag = next(t for t in doc["tags"] if t["tag"] == "graph operands")
        tag.update(count=0, bytes=0, paused_count=2, paused_bytes=3 << 30)
        self.assertRegex(_stat.render(doc), r"graph operands +0 B +0 allocations, 2 paused \(3.0 GiB\)\n")

    def test_control_characters_in_a_tag_are_escaped(self):
        doc = json.loads(self.text)
        doc["tags"][1]["tag"] = "a\x1b[31mred\\\x85" + "x" * 40
        shown = _stat.render(doc)
        self.assertIn("a\\x1b[31mred\\\\\\u0085xxxxxxxxx...", shown)
        self.assertNotIn("\x1b", shown)


class BadInput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(SAMPLE) as f:
            cls.sample = f.read()
        cls.dir = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def check(self, name, text, pattern):
        path = os.path.join(self.dir.name, name + ".json")
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = run_stat(path)
        self.assertEqual(rc, 2, f"{name}: {err}")
        self.assertEqual(out, "", f"{name}: printed a table for bad input")
        self.assertRegex(err, f"^vmmarena stat: {re.escape(path)}: {pattern}")

    def test_syntax(self):
        self.check("syntax", '{\n  "schema": "vmmarena.snapshot",\n  "version": 1,\n  oops\n}\n',
                   r"not JSON \(line 4 column 3: Expecting property name")

    def test_truncated(self):
        self.check("truncated", self.sample[:1000], r"not JSON \(line \d+ column \d+: ")

    def test_empty(self):
        self.check("empty", "", r"not JSON \(line 1 column 1: Expecting value\)$")

    def test_nan_and_repeated_keys(self):
        self.check("nan", self.sample.replace('"bound": 1', '"bound": NaN'), r"not JSON \(NaN is not a JSON value\)$")
        self.check("repeated", '{"schema": "a", "schema": "b"}',
                   r'not a vmmarena snapshot \(key "schema" appears twice in one object\)$')

    def test_not_a_snapshot(self):
        self.check("array", "[1, 2]", r"not a vmmarena snapshot \(the document is an array, not an object\)$")
        self.check("schema", '{"schema": "something.else", "version": 1}',
                   r'not a vmmarena snapshot \("schema" is "something.else", expected "vmmarena.snapshot"\)$')
        self.check("schema_type", '{"schema": 3}',
                   r'not a vmmarena snapshot \("schema" is a number, expected "vmmarena.snapshot"\)$')
        self.check("version", '{"schema": "vmmarena.snapshot", "version": 1}',
                   r"snapshot version 1 is not supported \(this tool reads versions 2 to 4\)")
        self.check("version_5", self.sample.replace('"version": 3', '"version": 5'),
                   r"snapshot version 5 is not supported \(this tool reads versions 2 to 4\)")

    def test_a_text_file_and_a_json_file_that_is_no_snapshot(self):
        """What a new user hands it first: any text file, any JSON file."""
        self.check("text", "hello\n", r"not JSON \(line 1 column 1: Expecting value\)\n$")
        self.check("other_json", '{"name": "x", "version": 3}\n', r'not a vmmarena snapshot \(no "schema" key\)\n$')
        rc, out, err = run_stat(stdin=b'{"a": 1}')
        self.assertEqual((rc, out, err),
                         (2, "", 'vmmarena stat: standard input: not a vmmarena snapshot (no "schema" key)\n'))
        rc, out, err = run_stat(stdin=b"caf\xe9")
        self.assertEqual((rc, out, err), (2, "", "vmmarena stat: standard input: not JSON (not UTF-8 at byte 3)\n"))

    def test_wrong_keys_and_values(self):
        self.check("missing_key", self.sample.replace('"hits"', '"hitz"'), r'snapshot key "pool.hits" is missing')
        self.check("wrong_type", self.sample.replace('"misses": 7', '"misses": "7"'),
                   r'snapshot key "pool.misses" is a string \("7"\), expected a number')
        self.check("negative", self.sample.replace('"misses": 7', '"misses": -7'),
                   r'snapshot key "pool.misses" is -7, expected a non-negative integer')
        self.check("fraction", self.sample.replace('"misses": 7', '"misses": 7.5'),
                   r'snapshot key "pool.misses" is 7.5, expected a non-negative integer')
        self.check("bad_state", self.sample.replace('"state": "pooled"', '"state": "floating"'),
                   r'snapshot key "mappings\[\d+\].state" has an unknown value "floating"')
        self.check("bad_scope", self.sample.replace('"state": "active"', '"state": "half"'),
                   r'snapshot key "scope.state" has an unknown value "half"')

    def test_usage(self):
        missing = os.path.join(self.dir.name, "does-not-exist.json")
        rc, out, err = run_stat(missing)
        self.assertEqual(rc, 2)
        self.assertIn(f"cannot open {missing}: No such file or directory", err)
        rc, out, err = run_stat("a.json", "b.json")
        self.assertEqual((rc, err), (2, "vmmarena stat: unexpected argument b.json (vmmarena stat --help)\n"))
        r = subprocess.run([sys.executable, "-m", "vmmarena", "stat", "--help"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: vmmarena stat [-h] [FILE]", r.stdout)


@unittest.skipUnless(os.environ.get("VMMARENA_FAKE_DRIVER"), "needs the shim and the fake driver (the CMake test)")
class LiveSnapshot(unittest.TestCase):
    """What the C library writes today renders: the sample file cannot drift from it unseen."""

    def test_render_a_fresh_snapshot(self):
        import fake_driver
        from vmmarena import _lib

        shim = _lib.lib()
        fake = fake_driver.load()
        os.environ["VMMARENA_LOG"] = "off"
        shim.vmm_torch_set_driver_for_testing(fake.fake_driver_reset(None))
        try:
            stream = ctypes.c_void_p(0x5001)
            shim.vmm_torch_tag_push(b"weights")
            p = shim.vmm_torch_package_allocate(3 << 20, 0, stream)
            shim.vmm_torch_tag_pop()
            self.assertTrue(p)
            shown = _stat.render(_stat.parse(_lib.snapshot_json(0)))
            self.assertRegex(shown, r"weights +4.0 MiB +1 allocation")
            self.assertRegex(shown, r"package +live +1 +4.0 MiB")
            shim.vmm_torch_free(p, 3 << 20, 0, stream)
        finally:
            shim.vmm_torch_set_driver_for_testing(None)


if __name__ == "__main__":
    unittest.main()
