"""The C tools built from bench/ (vmmarena-replay and every bench_*): --help prints the usage on
standard output and exits 0 without running anything, --version prints "NAME VERSION" (the
project version of CMakeLists.txt) and exits 0, an unknown option exits 2 with one line on
standard error. Every bench/*.c with a main() must be in the list ctest hands over.

Environment: VMMARENA_TOOLS = NAME=PATH;... (ctest tool_options, bench/tools.cmake);
VMMARENA_CUDA_STUB = the toolkit's libcuda.so stub, for the tools that link libcuda (bench_gpu,
bench_mapping), which then load where no driver is installed.
"""

import glob
import os
import re
import subprocess
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOLS = dict(item.split("=", 1) for item in os.environ.get("VMMARENA_TOOLS", "").split(";") if item)


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"^project\(vmmarena VERSION ([0-9.]+)", f.read(), re.M).group(1)


@unittest.skipUnless(TOOLS, "VMMARENA_TOOLS is not set (ctest sets it: test tool_options)")
class ToolOptions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.env = dict(os.environ)
        stub = os.environ.get("VMMARENA_CUDA_STUB")
        if stub:  # the stub under the name the tools were linked against
            os.symlink(stub, os.path.join(cls.dir.name, "libcuda.so.1"))
            cls.env["LD_LIBRARY_PATH"] = cls.dir.name + os.pathsep + cls.env.get("LD_LIBRARY_PATH", "")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def run_tool(self, name, *args):
        # cwd: a directory of its own, so a tool that ran by mistake writes nothing here
        return subprocess.run([TOOLS[name], *args], capture_output=True, text=True, timeout=30, env=self.env,
                              cwd=self.dir.name)

    def test_every_tool_with_a_main_is_listed(self):
        mains = set()
        for src in glob.glob(os.path.join(ROOT, "bench", "*.c")):
            with open(src) as f:
                if re.search(r"^int main\(", f.read(), re.M):
                    name = os.path.basename(src)[:-2]
                    mains.add("vmmarena-replay" if name == "replay" else name)
        self.assertEqual(mains - set(TOOLS), set(), "tools not checked here (bench/tools.cmake lists them)")

    def test_help(self):
        for name in TOOLS:
            for arg in ("--help", "-h"):
                with self.subTest(tool=name, arg=arg):
                    r = self.run_tool(name, arg)
                    self.assertEqual((r.returncode, r.stderr), (0, ""))
                    self.assertTrue(r.stdout.startswith(f"usage: {name}"), r.stdout[:200])

    def test_version(self):
        version = project_version()
        for name in TOOLS:
            with self.subTest(tool=name):
                r = self.run_tool(name, "--version")
                self.assertEqual((r.returncode, r.stdout, r.stderr), (0, f"{name} {version}\n", ""))

    def test_an_unknown_option_is_one_line(self):
        for name in TOOLS:
            with self.subTest(tool=name):
                r = self.run_tool(name, "--bogus")
                self.assertEqual((r.returncode, r.stdout, r.stderr),
                                 (2, "", f"{name}: unknown option --bogus ({name} --help)\n"))

    def test_the_replay_names_a_missing_value(self):
        r = self.run_tool("vmmarena-replay", "--capacity")
        self.assertEqual((r.returncode, r.stderr),
                         (2, "vmmarena-replay: --capacity needs a value (vmmarena-replay --help)\n"))

    def test_the_replay_stream_order(self):
        r = self.run_tool("vmmarena-replay", "--stream-order", "sometimes")
        self.assertEqual(r.returncode, 2)
        self.assertRegex(r.stderr, r"^vmmarena-replay: --stream-order: .*VMMARENA_STREAM_ORDER=\"sometimes\"")
        trace = os.path.join(ROOT, "tests", "data", "process.trace")
        peaks = {}
        for order in ("completed", "event"):
            r = self.run_tool("vmmarena-replay", "--cache", "--lag", "100", "--stream-order", order, "--csv",
                              os.path.join(self.dir.name, order + ".csv"), trace)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(self.dir.name, order + ".csv")) as f:
                peaks[order] = f.read()
        self.assertNotEqual(peaks["completed"], peaks["event"], "--stream-order changed nothing")


if __name__ == "__main__":
    unittest.main()
