"""What a new user meets first, from the `vmmarena` command and the package: --version, --help
on every command, one clear line for an unknown option or a missing command, `stat` refusing
to wait on a terminal, and a bad VMMARENA_* value raised as vmmarena.VmmarenaConfigError from
the public function called, with the variable, the value and the rule.

Environment: PYTHONPATH = shim/python (ctest python_cli). The configuration cases need the
shim (VMMARENA_LIBRARY, which ctest sets outside sanitizer builds, or an installed package's
copy) and are skipped where there is none.
"""

import os
import pty
import re
import subprocess
import sys
import unittest

import vmmarena

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
COMMANDS = ("stat", "memviz", "library", "build-allocator")


def run(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "vmmarena", *args], capture_output=True, text=True, timeout=60,
                          **kwargs)


def project_version():
    """The version in the top-level CMakeLists.txt's project(): the one the C tools print."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"^project\(vmmarena VERSION ([0-9.]+)", f.read(), re.M).group(1)


class CommandLine(unittest.TestCase):
    def test_version(self):
        r = run("--version")
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, f"vmmarena {vmmarena.__version__}\n", ""))

    def test_the_package_and_the_c_tools_have_one_version(self):
        self.assertEqual(vmmarena.__version__, project_version(),
                         "shim/python/vmmarena/__init__.py and CMakeLists.txt's project() disagree")

    def test_an_unknown_option_is_named(self):
        for args, want in ((["--bogus"], "vmmarena: unknown option --bogus (vmmarena --help)\n"),
                           (["--bogus", "stat"], "vmmarena: unknown option --bogus (vmmarena --help)\n"),
                           (["stat", "--bogus"], "vmmarena stat: unknown option --bogus (vmmarena stat --help)\n"),
                           (["library", "extra"], "vmmarena library: unexpected argument extra "
                                                  "(vmmarena library --help)\n"),
                           ([], "vmmarena: no COMMAND given: stat, memviz, library or build-allocator (vmmarena --help)\n")):
            with self.subTest(args=args):
                r = run(*args)
                self.assertEqual((r.returncode, r.stdout, r.stderr), (2, "", want))

    def test_argparse_errors_are_one_line(self):
        r = run("memviz", "x.trace")
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(r.stderr, "vmmarena memviz: the following arguments are required: -o/--output "
                                   "(vmmarena memviz --help)\n")
        r = run("memviz", "x.trace", "-o", "x.pickle", "--device", "-1")
        self.assertEqual((r.returncode, r.stderr), (2, "vmmarena memviz: --device must be 0 or more "
                                                        "(vmmarena memviz --help)\n"))

    def test_help_on_every_command(self):
        for args in ([], *([c] for c in COMMANDS)):
            with self.subTest(args=args):
                r = run(*args, "--help")
                self.assertEqual((r.returncode, r.stderr), (0, ""))
                self.assertTrue(r.stdout.startswith(f"usage: {' '.join(['vmmarena', *args])} "), r.stdout)
        self.assertIn("--version", run("--help").stdout)

    def test_stat_refuses_to_wait_on_a_terminal(self):
        controller, terminal = pty.openpty()
        try:
            r = run("stat", stdin=terminal)  # the timeout fails the test if it waits
        finally:
            os.close(terminal)
            os.close(controller)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(r.stderr, "vmmarena stat: no FILE and standard input is a terminal; give a snapshot file "
                                   "or pipe one in\n")

    def test_build_allocator_without_pytorch_is_one_line(self):
        # A stand-in torch that cannot be imported: what a machine without PyTorch sees.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.join(ROOT, "tests", "python", "no_torch")] + sys.path))
        r = run("build-allocator", env=env)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertRegex(r.stderr, r"^vmmarena build-allocator: PyTorch is needed for this call and could not be "
                                   r"imported: .+\n$")


def no_library():
    try:
        vmmarena.library_path()
    except vmmarena.VmmarenaError as e:
        return f"needs the shim: {e}"
    return None


@unittest.skipIf(no_library(), no_library())
class BadConfiguration(unittest.TestCase):
    """VMMARENA_HEADROOM=-5, as a user sets it, in a fresh process: the traceback the user sees."""

    RULE = ('VMMARENA_HEADROOM="-5": a size must not be negative; use a size such as 8G, 512M, 1.5G or 4096')
    # A stand-in for torch with what install() and use_as_default() look at before the check.
    FAKE_TORCH = ("import sys, types; torch = types.ModuleType('torch'); torch.__version__ = '0-fake'; "
                  "torch.cuda = types.SimpleNamespace(MemPool=object, use_mem_pool=object); "
                  "sys.modules['torch'] = torch; ")

    def traceback_of(self, code):
        env = dict(os.environ, VMMARENA_HEADROOM="-5")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        return r.stderr

    def test_raised_from_the_public_function_with_the_rule(self):
        for call in ("vmmarena.Storage(0)", "vmmarena.config_check()", "vmmarena.install()",
                     "vmmarena.use_as_default()"):
            with self.subTest(call=call):
                shown = self.traceback_of(f"{self.FAKE_TORCH}import vmmarena; {call}")
                last = shown.strip().splitlines()[-1]
                self.assertEqual(last, f"vmmarena.VmmarenaConfigError: VMM_ERR_INVALID_ARGUMENT: {self.RULE}")
                frames = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)', shown, re.M)
                self.assertEqual([os.path.basename(f) for f, _ in frames], ["<string>", "__init__.py"], shown)
                self.assertNotIn("_lib", shown)
                self.assertNotIn("During handling", shown)

    def test_caught_as_the_public_class(self):
        shown = self.traceback_of(
            "import vmmarena\n"
            "try:\n    vmmarena.Storage(0)\n"
            "except vmmarena.VmmarenaConfigError as e:\n"
            "    assert isinstance(e, ValueError) and isinstance(e, vmmarena.VmmarenaError)\n"
            "    assert e.status_name == 'VMM_ERR_INVALID_ARGUMENT', e.status_name\n"
            f"    assert e.message == {self.RULE!r}, e.message\n"
            "    raise SystemExit(1)\n")
        self.assertEqual(shown, "")


if __name__ == "__main__":
    unittest.main()
