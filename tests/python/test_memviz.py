"""`python3 -m vmmarena memviz`: the pickle it writes has the structure documented in
docs/memviz.md (the dict of torch.cuda.memory._snapshot()), checked here without torch:

- every segment, block and trace entry has exactly the documented fields, with their types;
- the pickle uses only the opcodes that memory_viz's own unpickler (MemoryViz.js) reads;
- replaying the trace entries from an empty allocator never frees what is not there, never puts
  a block outside a segment or two segments on one address, and ends in exactly the snapshot's
  segments. memory_viz's "Allocator State History" walks the same entries backwards from those
  segments, so it meets a consistent state at every entry;
- the conversion rules (pool hits, finish, abort, pause and resume, out of memory, assembly)
  on small traces, and the errors that name the line. What the trace format refuses, and that
  memviz refuses it exactly as the replay tool does, is test_trace_hostile.py.

memviz reads traces with the shim's reader: these tests need libvmmarena_torch.so. Without
VMMARENA_LIBRARY and with no shim to find, they are skipped (python_cli in a sanitizer build).

Environment: PYTHONPATH = shim/python (or an installed vmmarena), VMMARENA_LIBRARY.
"""

import glob
import gzip
import os
import pickle
import pickletools
import subprocess
import sys
import tempfile
import unittest

from vmmarena import _lib, _memviz

try:
    _lib.lib()
    NO_LIBRARY = None
except _lib.VmmarenaError as e:
    if os.environ.get("VMMARENA_LIBRARY"):
        raise
    NO_LIBRARY = f"no libvmmarena_torch.so to read traces with: {e}"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DEFAULT_TRACE = os.path.join(ROOT, "bench", "traces", "default.trace.gz")
SYNTHETIC_TRACE = os.path.join(ROOT, "bench", "traces", "synthetic-catalog.trace.gz")
MiB = 1 << 20

# ---- The documented format (docs/memviz.md) -------------------------------------------------

TOP = {"segments": list, "device_traces": list, "external_annotations": list}
SEGMENT = {"device": int, "address": int, "total_size": int, "allocated_size": int, "active_size": int,
           "requested_size": int, "stream": int, "segment_type": str, "segment_pool_id": tuple,
           "is_expandable": bool, "frames": list, "blocks": list}
BLOCK = {"address": int, "size": int, "requested_size": int, "state": str, "frames": list}
ENTRY = {"action": str, "addr": int, "size": int, "stream": int, "time_us": int, "frames": list}
OOM_ENTRY = {"action": str, "device_free": int, "size": int, "stream": int, "time_us": int, "frames": list}
FRAME = {"filename": str, "line": int, "name": str}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
BLOCK_STATES = {"active_allocated", "inactive"}
# What MemoryViz.js's unpickler handles (protocol 2 to 4).
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST",
                  "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "MEMOIZE",
                  "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "BININT", "BININT1", "BININT2", "LONG1",
                  "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE", "NEWTRUE", "NEWFALSE"}


def fields(test, what, d, spec):
    test.assertIsInstance(d, dict, what)
    test.assertEqual(set(d), set(spec), f"{what}: fields")
    for key, kind in spec.items():
        test.assertIsInstance(d[key], kind, f"{what}.{key}")
        if kind is int:
            test.assertNotIsInstance(d[key], bool, f"{what}.{key}")


def check_structure(test, snap):
    fields(test, "snapshot", snap, TOP)
    for i, seg in enumerate(snap["segments"]):
        w = f"segments[{i}]"
        fields(test, w, seg, SEGMENT)
        test.assertEqual(seg["segment_type"], "large", w)
        test.assertEqual(seg["segment_pool_id"], (0, 0), w)
        test.assertGreater(seg["total_size"], 0, w)
        test.assertGreaterEqual(len(seg["blocks"]), 1, w)
        addr = seg["address"]
        allocated = requested = 0
        for j, b in enumerate(seg["blocks"]):
            fields(test, f"{w}.blocks[{j}]", b, BLOCK)
            test.assertIn(b["state"], BLOCK_STATES)
            test.assertEqual(b["address"], addr, f"{w}.blocks[{j}]: blocks tile the segment")
            test.assertLessEqual(b["requested_size"], b["size"])
            if b["state"] == "active_allocated":
                allocated += b["size"]
                requested += b["requested_size"]
            else:
                test.assertEqual(b["requested_size"], 0)
            for k, f in enumerate(b["frames"]):
                fields(test, f"{w}.blocks[{j}].frames[{k}]", f, FRAME)
            addr += b["size"]
        test.assertEqual(addr, seg["address"] + seg["total_size"], f"{w}: blocks cover the segment")
        test.assertEqual((seg["allocated_size"], seg["active_size"], seg["requested_size"]),
                         (allocated, allocated, requested), w)
    for d, trace in enumerate(snap["device_traces"]):
        test.assertIsInstance(trace, list)
        for i, e in enumerate(trace):
            w = f"device_traces[{d}][{i}]"
            test.assertIn(e.get("action"), ACTIONS, w)
            fields(test, w, e, OOM_ENTRY if e["action"] == "oom" else ENTRY)
            for k, f in enumerate(e["frames"]):
                fields(test, f"{w}.frames[{k}]", f, FRAME)
            test.assertGreaterEqual(e["size"], 0, w)
        times = [e["time_us"] for e in trace]
        test.assertEqual(times, sorted(times), f"device_traces[{d}]: time_us never decreases")


def check_replay(test, snap, device=0):
    """Replays device `device`'s entries from nothing; returns the counts of each action."""
    segs = {}  # address -> size
    blocks = {}  # address -> [size, freeing]
    counts = dict.fromkeys(ACTIONS, 0)

    def segment_of(addr):
        found = [a for a, size in segs.items() if a <= addr < a + size]
        test.assertEqual(len(found), 1, f"0x{addr:x}: in {len(found)} segments")
        return found[0]

    for i, e in enumerate(snap["device_traces"][device]):
        w = f"entry {i} ({e['action']})"
        a = e.get("addr")
        counts[e["action"]] += 1
        if e["action"] == "segment_alloc":
            for other, size in segs.items():
                test.assertFalse(other < a + e["size"] and a < other + size, f"{w}: overlaps 0x{other:x}")
            segs[a] = e["size"]
        elif e["action"] == "segment_free":
            test.assertEqual(segs.pop(a, None), e["size"], f"{w}: frees a segment that is not there")
            test.assertFalse([b for b in blocks if a <= b < a + e["size"]], f"{w}: blocks left in it")
        elif e["action"] == "alloc":
            test.assertNotIn(a, blocks, f"{w}: block already allocated")
            s = segment_of(a)
            test.assertLessEqual(a + e["size"], s + segs[s], f"{w}: past its segment")
            blocks[a] = [e["size"], False]
        elif e["action"] == "free_requested":
            test.assertIn(a, blocks, f"{w}: no such block")
            test.assertFalse(blocks[a][1], f"{w}: freed twice")
            blocks[a][1] = True
        elif e["action"] == "free_completed":
            test.assertTrue(a in blocks and blocks[a][1], f"{w}: not requested first")
            del blocks[a]
    final = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}
    test.assertEqual(segs, final, "the entries end in the snapshot's segments")
    live = {b["address"]: b["requested_size"] for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"}
    test.assertEqual({a: v[0] for a, v in blocks.items()}, live, "and in its allocated blocks")
    test.assertFalse([a for a, v in blocks.items() if v[1]], "no free left half done")
    return counts


def check_opcodes(test, data):
    used = {op.name for op, _, _ in pickletools.genops(data)}
    test.assertLessEqual(used, VIEWER_OPCODES, "opcodes memory_viz cannot read")
    test.assertEqual(data[:2], b"\x80\x04", "pickle protocol 4")


# ---- Small traces -----------------------------------------------------------------------------


def trace_text(*records, version=1):
    return f"vmmtrace {version}\n" + "".join(r + "\n" for r in records)


@unittest.skipIf(NO_LIBRARY, NO_LIBRARY)
class Converting(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def convert(self, *records, retention=True, gz=False, version=1):
        path = os.path.join(self.dir.name, "t.trace" + (".gz" if gz else ""))
        with (gzip.open if gz else open)(path, "wt") as f:
            f.write(trace_text(*records, version=version))
        snap, conv = _memviz.convert(path, retention=retention)
        check_structure(self, snap)
        check_replay(self, snap)
        return snap, conv

    def actions(self, snap):
        return [(e["action"], e.get("addr", 0), e["size"]) for e in snap["device_traces"][0]]

    def test_alloc_and_free_outside_a_scope(self):
        snap, _ = self.convert("10 alloc package 3145728 4194304 0x7f0000000000 0x5001 weights VMM_OK",
                               "2000 free package 0 4194304 0x7f0000000000 0x5001 weights VMM_OK")
        self.assertEqual(self.actions(snap), [
            ("segment_alloc", 0x7F0000000000, 4 * MiB), ("alloc", 0x7F0000000000, 3 * MiB),
            ("free_requested", 0x7F0000000000, 3 * MiB), ("free_completed", 0x7F0000000000, 3 * MiB),
            ("segment_free", 0x7F0000000000, 4 * MiB)])
        first = snap["device_traces"][0][0]
        self.assertEqual(first["frames"], [{"filename": "package", "line": 2, "name": "weights"}])
        self.assertEqual(first["stream"], 0x5001)
        self.assertEqual(snap["device_traces"][0][-1]["time_us"], 2)
        self.assertEqual(snap["segments"], [])

    def test_pool_hit_finish_and_the_final_state(self):
        snap, conv = self.convert(
            "1 alloc package 2097152 2097152 0x7f0000800000 0x0 - VMM_OK",
            "2 begin - 0 0 0x0 0x0 - VMM_OK",
            "3 alloc transient 4194304 4194304 0x7f0000000000 0x5001 prefill%20100%25 VMM_OK",
            "4 free transient 0 4194304 0x7f0000000000 0x5001 prefill%20100%25 VMM_OK",
            "5 alloc transient 3145733 4194304 0x7f0000000000 0x5001 d%C3%A9codage VMM_OK",
            "6 free transient 0 4194304 0x7f0000000000 0x5001 d%C3%A9codage VMM_OK",
            "7 finish - 0 0 0x0 0x0 - VMM_OK")
        acts = [a for a, _, _ in self.actions(snap)]
        self.assertEqual(acts, ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed",
                                "alloc", "free_requested", "free_completed", "segment_free"])
        self.assertEqual(conv.counts["pool_hits"], 1)
        self.assertEqual(snap["device_traces"][0][6]["frames"][0]["name"], "décodage")
        self.assertEqual(snap["device_traces"][0][2]["frames"][0]["name"], "prefill 100%")
        (seg,) = snap["segments"]  # the package allocation is still live
        self.assertEqual((seg["address"], seg["total_size"], seg["requested_size"]), (0x7F0000800000, 2 * MiB, 2 * MiB))
        self.assertEqual(seg["blocks"][0]["state"], "active_allocated")
        self.assertEqual(seg["blocks"][0]["frames"][0]["name"], "(no tag)")

    def test_abort_leaves_pooled_memory_as_inactive_segments(self):
        snap, _ = self.convert(
            "1 begin - 0 0 0x0 0x0 - VMM_OK",
            "2 alloc transient 1048576 2097152 0x7f0000000000 0x0 - VMM_OK",
            "3 free transient 0 2097152 0x7f0000000000 0x0 - VMM_OK",
            "4 abort - 0 0 0x0 0x0 - VMM_OK")
        (seg,) = snap["segments"]
        self.assertEqual((seg["allocated_size"], seg["blocks"][0]["state"]), (0, "inactive"))

    def test_retention_off_releases_at_once(self):
        snap, _ = self.convert(
            "1 begin - 0 0 0x0 0x0 - VMM_OK",
            "2 alloc transient 1048576 2097152 0x7f0000000000 0x0 - VMM_OK",
            "3 free transient 0 2097152 0x7f0000000000 0x0 - VMM_OK",
            "4 alloc transient 1048576 2097152 0x7f0000000000 0x0 - VMM_OK",
            retention=False)
        self.assertEqual([a for a, _, _ in self.actions(snap)].count("segment_alloc"), 2)

    def test_package_free_inside_a_scope_unmaps(self):
        snap, _ = self.convert(
            "1 begin - 0 0 0x0 0x0 - VMM_OK",
            "2 alloc package 2097152 2097152 0x7f0000000000 0x0 w VMM_OK",
            "3 free package 0 2097152 0x7f0000000000 0x0 w VMM_OK")
        self.assertEqual(self.actions(snap)[-1][0], "segment_free")

    def test_a_new_range_over_a_pooled_one_takes_it_apart(self):
        _, conv = self.convert(
            "1 begin - 0 0 0x0 0x0 - VMM_OK",
            "2 alloc transient 2097152 2097152 0x7f0000000000 0x0 - VMM_OK",
            "3 free transient 0 2097152 0x7f0000000000 0x0 - VMM_OK",
            "4 alloc transient 4194304 4194304 0x7f0000000000 0x0 - VMM_OK")
        self.assertEqual(conv.counts["pooled_dropped"], 1)

    def test_pause_and_resume(self):
        snap, conv = self.convert(
            "1 alloc package 2097152 2097152 0x7f0000000000 0x0 weights VMM_OK",
            "2 alloc package 4194304 4194304 0x7f0000200000 0x0 weights VMM_OK",
            "3 alloc package 2097152 2097152 0x7f0000600000 0x0 kv VMM_OK",
            "4 pause-discard - 0 6291456 0x0 0x0 weights VMM_OK",
            "5 free package 0 4194304 0x7f0000200000 0x0 weights VMM_OK",
            "6 pause-backup - 0 2097152 0x0 0x0 kv VMM_OK",
            "7 resume - 0 2097152 0x0 0x0 weights VMM_OK",
            "8 resume - 0 2097152 0x0 0x0 kv VMM_OK")
        self.assertEqual((conv.counts["paused"], conv.counts["resumed"]), (3, 2))
        self.assertEqual(conv.warnings, [])
        self.assertEqual(sorted(s["address"] for s in snap["segments"]), [0x7F0000000000, 0x7F0000600000])
        acts = [a for a, _, _ in self.actions(snap)]
        self.assertEqual(acts.count("segment_free"), 3)
        self.assertEqual(acts.count("segment_alloc"), 5)

    def test_a_pause_that_disagrees_with_the_trace_is_a_warning(self):
        _, conv = self.convert("1 alloc package 2097152 2097152 0x7f0000000000 0x0 w VMM_OK",
                               "2 pause-discard - 0 4194304 0x0 0x0 w VMM_OK")
        self.assertEqual(len(conv.warnings), 1)
        self.assertIn(": line 3: pause of tag 'w' reports 4194304 B; the trace's mappings of that tag hold 2097152 B",
                      conv.warnings[0])

    def test_out_of_memory_failures_and_frees_from_before_the_trace(self):
        snap, conv = self.convert(
            "1 alloc transient 104857600 104857600 0x0 0x5001 x VMM_ERR_OUT_OF_MEMORY",
            "2 free - 0 0 0x7f0000401000 0x5001 - VMM_ERR_UNKNOWN_POINTER",
            "3 free package 0 2097152 0x7f0000800000 0x0 - VMM_OK",
            gz=True)
        (oom,) = snap["device_traces"][0]
        self.assertEqual((oom["action"], oom["size"], oom["device_free"]), ("oom", 104857600, 0))
        self.assertEqual((conv.counts["skipped_failures"], conv.counts["frees_before_trace"]), (1, 1))

    def test_device_ordinal(self):
        path = os.path.join(self.dir.name, "d.trace")
        with open(path, "w") as f:
            f.write(trace_text("1 alloc package 2097152 2097152 0x7f0000000000 0x0 - VMM_OK"))
        snap, _ = _memviz.convert(path, device=2)
        self.assertEqual([len(t) for t in snap["device_traces"]], [0, 0, 2])
        self.assertEqual(snap["segments"][0]["device"], 2)
        check_replay(self, snap, device=2)

    def test_errors_name_the_line(self):
        cases = [
            (["1 alloc package 1 2097152 0x1000 0x0 - VMM_OK", "2 alloc package 1 2097152 0x1000 0x0 - VMM_OK"],
             ": line 3: alloc returned 0x1000, live since line 2"),
            (["1 alloc package 1 4194304 0x1000 0x0 - VMM_OK", "2 alloc package 1 2097152 0x201000 0x0 - VMM_OK"],
             ": line 3: 0x201000 (+2097152) overlaps the live mapping at 0x1000 (+4194304) from line 2"),
            (["1 alloc package 1 2097152 0x1000 0x0 - VMM_OK", "2 pause-discard - 0 2097152 0x0 0x0 - VMM_OK",
              "3 alloc package 1 2097152 0x1000 0x0 - VMM_OK"],
             ": line 4: alloc returned 0x1000, paused since line 3"),
            (["1 alloc package 1 2097152 0x1000 0x0 - VMM_OK", "2 defrag - 0 0 0x0 0x0 - VMM_OK"],
             ': line 3: unknown operation "defrag" (alloc, free, begin, finish, abort, pause-discard, pause-backup, '
             "resume)"),
        ]
        for records, message in cases:
            path = os.path.join(self.dir.name, "bad.trace")
            with open(path, "w") as f:
                f.write(trace_text(*records))
            with self.assertRaises(_memviz.TraceError) as cm:
                _memviz.convert(path)
            self.assertEqual(str(cm.exception), path + message)

    def test_whole_process_calls_make_no_entry(self):
        snap, conv = self.convert(
            "1 alloc package 2097152 2097152 0x7f0000800000 0x0 - VMM_OK 0",
            "2 capture-begin - 0 0 0x0 0x0 - VMM_OK 3",
            "3 alloc transient 4194304 4194304 0x7f0000000000 0x5001 - VMM_OK 3",
            "4 record-stream - 0 0 0x7f0000000000 0x5002 - VMM_OK 0",
            "5 capture-end - 0 0 0x0 0x0 - VMM_OK 3",
            "6 capture-end - 0 0 0x0 0x0 - VMM_ERR_INVALID_ARGUMENT 3",
            "7 free transient 0 4194304 0x7f0000000000 0x5001 - VMM_OK 0",
            "8 release-pool - 0 0 0x0 0x0 - VMM_OK 3",
            "9 empty-cache - 0 4194304 0x0 0x0 - VMM_OK 0",
            version=2)
        self.assertEqual([a for a, _, _ in self.actions(snap)],
                         ["segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed",
                          "segment_free"])
        self.assertEqual((conv.counts["process_calls"], conv.counts["skipped_failures"]), (5, 1))
        (seg,) = snap["segments"]
        self.assertEqual(seg["address"], 0x7F0000800000)

    def test_a_limit_makes_no_entry(self):
        snap, conv = self.convert(
            "0 set-limit - 8388608 0 0x0 0x0 - VMM_OK 0",
            "1 alloc package 2097152 2097152 0x7f0000800000 0x0 - VMM_OK 0",
            "2 set-limit - 0 0 0x0 0x0 - VMM_OK 0",
            version=2)
        self.assertEqual([a for a, _, _ in self.actions(snap)], ["segment_alloc", "alloc"])
        self.assertEqual((conv.counts["limits"], conv.counts["records"]), (2, 3))

    def test_a_version_1_line_in_a_version_2_trace(self):
        path = os.path.join(self.dir.name, "mixed.trace")
        with open(path, "w") as f:
            f.write(trace_text("1 alloc package 1 2097152 0x1000 0x0 - VMM_OK", version=2))
        with self.assertRaises(_memviz.TraceError) as cm:
            _memviz.convert(path)
        self.assertEqual(str(cm.exception), path + ": line 2: 9 fields, expected 10 (time, operation, kind, requested, "
                         'rounded, pointer, stream, tag, result, pool): a version 2 trace ("vmmtrace 2") ends every '
                         "line with a pool")

    def test_tags_are_decoded_bytes(self):
        snap, conv = self.convert("1 alloc package 2097152 2097152 0x7f0000000000 0x0 %1B%5B2J%FF VMM_OK",
                                  "2 pause-discard - 0 4194304 0x0 0x0 %1B%5B2J%FF VMM_OK")
        self.assertEqual(snap["device_traces"][0][0]["frames"][0]["name"], "\x1b[2J\ufffd")
        self.assertIn("pause of tag '\\x1b[2J\\ufffd' reports", conv.warnings[0], "warnings are ASCII")


class NoTrace(unittest.TestCase):
    """A text file that is no trace is told so before the library reads it (so without one)."""

    def test_a_text_file_has_no_vmmtrace_header(self):
        with tempfile.TemporaryDirectory() as d:
            for name, content in (("notes.txt", b"a b c d e\n"), ("one-word.txt", b"hello"),
                                  ("almost.trace", b"vmmtrac\n"), ('we\x1bird "name".txt', b"x y\n")):
                with self.subTest(name=name):
                    path = os.path.join(d, name)
                    with open(path, "wb") as f:
                        f.write(content)
                    r = subprocess.run([sys.executable, "-m", "vmmarena", "memviz", path, "-o", path + ".pickle"],
                                       capture_output=True, text=True)
                    shown = path.replace("\\", "\\\\").replace('"', '\\"').replace("\x1b", "\\x1b")
                    self.assertEqual((r.returncode, r.stdout), (2, ""))
                    self.assertEqual(r.stderr, f"vmmarena memviz: {shown}: no vmmtrace header "
                                               '(a trace begins with the line "vmmtrace 2")\n')
                    self.assertFalse(os.path.exists(path + ".pickle"))


@unittest.skipIf(NO_LIBRARY, NO_LIBRARY)
class RecordedTraces(unittest.TestCase):
    """The command on the committed traces, read back from the pickle."""

    def run_memviz(self, trace):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "x.pickle")
            r = subprocess.run([sys.executable, "-m", "vmmarena", "memviz", trace, "-o", out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, "rb") as f:
                data = f.read()
        check_opcodes(self, data)
        snap = pickle.loads(data)
        check_structure(self, snap)
        return snap, check_replay(self, snap), r.stdout

    def test_default_trace(self):
        snap, counts, out = self.run_memviz(DEFAULT_TRACE)
        with gzip.open(DEFAULT_TRACE, "rt") as f:
            records = [line.split() for line in f if line[0].isdigit()]
        ok_allocs = sum(1 for r in records if r[1] == "alloc" and r[8] == "VMM_OK")
        self.assertEqual(counts["alloc"], ok_allocs, "one alloc entry per successful alloc")
        self.assertGreater(counts["segment_alloc"], 0)
        self.assertLess(counts["segment_alloc"], ok_allocs, "pool hits make no segment")
        self.assertIn(f"{len(snap['segments'])} segments at the end", out)

    def test_every_committed_trace(self):
        traces = sorted(glob.glob(os.path.join(ROOT, "bench", "traces", "*.trace.gz")))
        self.assertIn(os.path.abspath(SYNTHETIC_TRACE), [os.path.abspath(t) for t in traces])
        for trace in traces:
            with self.subTest(trace=os.path.basename(trace)):
                _, counts, _ = self.run_memviz(trace)
                self.assertGreater(counts["alloc"], 0)

    def test_a_whole_process_trace(self):
        """tests/data/process.trace: version 2, recorded by a caching arena on the fake driver."""
        _, counts, out = self.run_memviz(os.path.join(ROOT, "tests", "data", "process.trace"))
        self.assertEqual(counts["alloc"], 31)
        self.assertIn("; 17 whole-process calls (captures, graph pools, empty-cache, record-stream)", out)
        self.assertNotIn("set-limit", out)

    def test_a_trace_that_sets_a_limit(self):
        _, counts, out = self.run_memviz(os.path.join(ROOT, "tests", "data", "limit.trace"))
        self.assertEqual(counts["alloc"], 3)
        self.assertIn("; 2 set-limit", out)

    def test_usage_errors(self):
        r = subprocess.run([sys.executable, "-m", "vmmarena", "memviz", "/nonexistent.trace", "-o", "/tmp/x.pickle"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual("vmmarena memviz: /nonexistent.trace: cannot open: No such file or directory\n", r.stderr)
        r = subprocess.run([sys.executable, "-m", "vmmarena", "memviz", DEFAULT_TRACE], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("-o/--output", r.stderr)


if __name__ == "__main__":
    unittest.main()
