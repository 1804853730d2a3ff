"""Hostile traces against both readers of trace files: the replay tool (vmmarena-replay) and
`python3 -m vmmarena memviz`. Both read through the library's vmm_trace_reader_open, so on
every file of the table they must agree: exit status 2, nothing on standard output, one line on
standard error, only printable ASCII, and the same message after the program's name, which is
the one the table expects. A good trace is the control: both accept it.

Environment: VMMARENA_REPLAY = the vmmarena-replay binary, VMMARENA_LIBRARY = the shim,
PYTHONPATH = shim/python (ctest sets them: shim/CMakeLists.txt, test trace_hostile).
"""

import gzip
import os
import subprocess
import sys
import tempfile
import unittest

REPLAY = os.environ.get("VMMARENA_REPLAY")
OPS = ("alloc", "free", "begin", "finish", "abort", "pause-discard", "pause-backup", "resume",
       "capture-begin", "capture-end", "release-pool", "empty-cache", "record-stream", "set-limit")
PREFIX = {"replay": b"vmmarena-replay: ", "memviz": b"vmmarena memviz: "}

# The example of docs/trace.md: a scope with a pool hit, a refused request, a bad free.
GOOD = b"""vmmtrace 2
8973 alloc package 6291457 8388608 0x7f0fff800000 0x0 weights VMM_OK 0
23014 begin - 0 0 0x0 0x0 - VMM_OK 0
25007 alloc transient 4194304 4194304 0x7f0fff400000 0x5001 prefill%20100%25 VMM_OK 0
27301 free transient 0 4194304 0x7f0fff400000 0x5001 prefill%20100%25 VMM_OK 0
28473 alloc transient 3145733 4194304 0x7f0fff400000 0x5001 prefill%20100%25 VMM_OK 0
43255 alloc transient 104857600 104857600 0x0 0x5001 d%C3%A9codage VMM_ERR_OUT_OF_MEMORY 0
46800 free - 0 0 0x7f0fff401000 0x5001 - VMM_ERR_UNKNOWN_POINTER 0
47461 free transient 0 4194304 0x7f0fff400000 0x5001 prefill%20100%25 VMM_OK 0
54121 finish - 0 0 0x0 0x0 - VMM_OK 0
57025 free package 0 8388608 0x7f0fff800000 0x0 weights VMM_OK 0
"""
LINES = GOOD.splitlines(keepends=True)
# The same trace in version 1 (nine fields, no pool), which both tools still read.
GOOD_V1 = b"vmmtrace 1\n" + b"".join(line[: line.rindex(b" ")] + b"\n" for line in LINES[1:])


def gz(data):
    return gzip.compress(data, mtime=0)


def with_line(n, text):
    """GOOD with line n (1-based) replaced by text."""
    return b"".join(LINES[: n - 1]) + text + b"\n" + b"".join(LINES[n:])


def corrupt(data):
    damaged = bytearray(data)
    damaged[-8] ^= 0x5A  # the CRC of the data
    return bytes(damaged)


ALL_OPS = "(" + ", ".join(OPS) + ")"
NO_HEADER = 'no vmmtrace header (a trace begins with the line "vmmtrace 2")'
DIRECTORY = object()  # content: make a directory of that name
# (what, file name, content or None for no file, the message after "FILE NAME: ")
CASES = [
    ("no header", "noheader.trace", b"".join(LINES[1:]), NO_HEADER),
    # Any text file: the header is checked before the first line is read as a record (no "5
    # fields, expected 10"); both tools make that check themselves (the reader would not).
    ("a text file that is no trace", "notes.txt", b"a b c d e\n", NO_HEADER),
    ("a comment before the header", "comment.trace", b"# recorded today\n" + GOOD, NO_HEADER),
    ("an empty file", "empty.trace", b"", 'empty file (a trace begins with the line "vmmtrace 2")'),
    ("%00 in a tag", "nul.trace", with_line(2, b"8973 alloc package 6291457 8388608 0x7f0fff800000 0x0 w%00 VMM_OK 0"),
     'line 2: tag "w%00": %00 (a NUL byte) cannot be in a tag'),
    ("double spaces", "spaces.trace", with_line(3, b"23014 begin -  0 0 0x0 0x0 - VMM_OK 0"),
     "line 3: two spaces at column 14 (fields are separated by one space)"),
    ("a binary file", "binary.trace", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), NO_HEADER),
    ("binary bytes after the header", "binary-body.trace", b"vmmtrace 2\n\x7fELF\x02\x01\x01\x00" + bytes(range(256)),
     "line 2: byte \\x7f at column 1 is not printable ASCII"),
    ("a truncated gzip", "cut.trace.gz", gz(GOOD)[: len(gz(GOOD)) // 2], "truncated gzip data"),
    ("only the gzip magic", "magic.trace.gz", b"\x1f\x8b", "truncated gzip data"),
    ("a corrupt gzip", "bad.trace.gz", corrupt(gz(GOOD)), "corrupt gzip data"),
    ("an unknown operation", "op.trace", with_line(3, b"23014 allc - 0 0 0x0 0x0 - VMM_OK 0"),
     f'line 3: unknown operation "allc" {ALL_OPS}'),
    ("a bad line inside gzip", "op.trace.gz", gz(with_line(11, b"57025 free")),
     "line 11: 2 fields, expected 10 (time, operation, kind, requested, rounded, pointer, stream, tag, result, pool)"),
    ("terminal escapes in a tag", "escape.trace",
     with_line(2, b"1 alloc package 1 2097152 0x1000 0x0 \x1b[2J\x1b[31m VMM_OK 0"),
     "line 2: byte \\x1b at column 38 is not printable ASCII"),
    ("UTF-8 in a tag", "utf8.trace", with_line(2, "1 alloc package 1 2097152 0x1000 0x0 décodage VMM_OK 0".encode()),
     "line 2: byte \\xc3 at column 39 is not printable ASCII"),
    ("a second header", "twice.trace", GOOD + GOOD, 'line 12: a second header ("vmmtrace 2" is the first line only)'),
    ("another version", "v3.trace", b"vmmtrace 3\n" + b"".join(LINES[1:]),
     'line 1: unsupported header "vmmtrace 3" (this reader reads "vmmtrace 1" and "vmmtrace 2")'),
    ("version 2 lines under a version 1 header", "v1-header.trace", b"vmmtrace 1\n" + b"".join(LINES[1:]),
     "line 2: 10 fields, expected 9 (time, operation, kind, requested, rounded, pointer, stream, tag, result): "
     'a version 1 trace ("vmmtrace 1") has no pool field'),
    ("version 1 lines under a version 2 header", "v2-header.trace", b"vmmtrace 2\n" + b"".join(GOOD_V1.splitlines(True)[1:]),
     "line 2: 9 fields, expected 10 (time, operation, kind, requested, rounded, pointer, stream, tag, result, pool): "
     'a version 2 trace ("vmmtrace 2") ends every line with a pool'),
    ("a version 2 operation in version 1", "v1-op.trace", GOOD_V1 + b"60000 empty-cache - 0 0 0x0 0x0 - VMM_OK\n",
     'line 12: operation "empty-cache" is not in version 1 ("vmmtrace 1"); it came with "vmmtrace 2"'),
    ("a pool that is not decimal", "pool.trace", with_line(3, b"23014 capture-begin - 0 0 0x0 0x0 - VMM_OK 0x3"),
     'line 3: pool "0x3" is not a decimal number below 2^64'),
    ("a pool on an operation that takes none", "free-pool.trace",
     with_line(11, b"57025 free package 0 8388608 0x7f0fff800000 0x0 weights VMM_OK 3"),
     'line 11: free takes no pool (0), found "3"'),
    ("an unknown result", "result.trace", with_line(3, b"23014 begin - 0 0 0x0 0x0 - VMM_FINE 0"),
     'line 3: unknown result "VMM_FINE" (a status name: VMM_OK, VMM_ERR_...)'),
    ("no such file", "missing.trace", None, "cannot open: No such file or directory"),
    ("a directory", "adir.trace", DIRECTORY, "cannot read the file: Is a directory"),
]


@unittest.skipUnless(REPLAY, "VMMARENA_REPLAY is not set (ctest sets it: test trace_hostile)")
class HostileTraces(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def run_both(self, name, env=None):
        """{tool: CompletedProcess} for the file `name` in the test directory (cwd)."""
        out = os.path.join(self.dir.name, "out.pickle")
        commands = {"replay": [REPLAY, name],
                    "memviz": [sys.executable, "-m", "vmmarena", "memviz", name, "-o", out]}
        return {tool: subprocess.run(cmd, cwd=self.dir.name, capture_output=True, timeout=120, env=env)
                for tool, cmd in commands.items()}

    def write(self, name, content):
        path = os.fsencode(os.path.join(self.dir.name, name))
        if content is DIRECTORY:
            os.mkdir(path)
        elif content is not None:
            with open(path, "wb") as f:
                f.write(content)

    def assert_refused_alike(self, name, content, env=None):
        self.write(name, content)
        runs = self.run_both(name, env)
        rests = {}
        for tool, r in runs.items():
            self.assertEqual(r.returncode, 2, f"{tool}: {r.stderr!r}")
            self.assertEqual(r.stdout, b"", tool)
            self.assertTrue(r.stderr.endswith(b"\n") and r.stderr.count(b"\n") == 1, f"{tool}: one line: {r.stderr!r}")
            self.assertTrue(all(0x20 <= b <= 0x7E for b in r.stderr[:-1]), f"{tool}: not printable: {r.stderr!r}")
            self.assertTrue(r.stderr.startswith(PREFIX[tool]), f"{tool}: {r.stderr!r}")
            rests[tool] = r.stderr[len(PREFIX[tool]):-1].decode("ascii")
        self.assertEqual(rests["replay"], rests["memviz"], "the two tools disagree")
        return rests["replay"]

    def test_the_table(self):
        for what, name, content, want in CASES:
            with self.subTest(what):
                got = self.assert_refused_alike(name, content)
                self.assertEqual(got, f"{name}: {want}")

    def test_the_unknown_operation_message_lists_every_operation(self):
        (case,) = [c for c in CASES if c[0] == "an unknown operation"]
        got = self.assert_refused_alike(case[1], case[2])
        listed = got[got.rindex("(") + 1 : -1].split(", ")
        self.assertEqual(listed, list(OPS))

    def test_no_gzip_to_run(self):
        empty = os.path.join(self.dir.name, "empty-path")
        os.mkdir(empty)
        got = self.assert_refused_alike("t.trace.gz", gz(GOOD), env=dict(os.environ, PATH=empty))
        self.assertEqual(got, "t.trace.gz: gzip-compressed, but gzip cannot be run: No such file or directory")

    def test_a_file_name_is_escaped(self):
        name = b"we\x1bird \\name\".trace"
        got = self.assert_refused_alike(os.fsdecode(name), b"")
        self.assertEqual(got, 'we\\x1bird \\\\name\\".trace: empty file (a trace begins with the line "vmmtrace 2")')
        os.unlink(os.path.join(os.fsencode(self.dir.name), name))
        got = self.assert_refused_alike(os.fsdecode(name), b"no trace\n")  # the tools' own check
        self.assertEqual(got, f'we\\x1bird \\\\name\\".trace: {NO_HEADER}')

    def test_a_good_trace_is_read_by_both(self):
        for name, content in (("good.trace", GOOD), ("good.trace.gz", gz(GOOD)),
                              ("crlf.trace", GOOD.replace(b"\n", b"\r\n")), ("no-final-newline.trace", GOOD[:-1]),
                              ("version-1.trace", GOOD_V1), ("version-1.trace.gz", gz(GOOD_V1))):
            with self.subTest(name):
                self.write(name, content)
                runs = self.run_both(name)
                for tool, r in runs.items():
                    self.assertEqual(r.returncode, 0, f"{tool}: {r.stderr!r}")
                    self.assertEqual(r.stderr, b"", tool)
                self.assertIn(f"trace: {name}: 8 operations (3 alloc, 3 free, 2 scope); not replayed: 2 recorded failures".encode(), runs["replay"].stdout)
                self.assertIn(b"14 trace entries from 10 records, 0 segments at the end (0 allocated); 1 pool hits, 1 out-of-memory", runs["memviz"].stdout)


if __name__ == "__main__":
    unittest.main()
