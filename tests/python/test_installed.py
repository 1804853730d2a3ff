"""The vmmarena package as pip installs it (run by tests/wheel-check, skipped elsewhere): it
is imported from the installed copy, and the shim it loads is the one inside that package,
with no VMMARENA_LIBRARY.

Environment: VMMARENA_EXPECT_INSTALLED = the installed package's directory.
"""

import os
import subprocess
import sys
import unittest

EXPECTED = os.environ.get("VMMARENA_EXPECT_INSTALLED")


@unittest.skipUnless(EXPECTED, "VMMARENA_EXPECT_INSTALLED is not set (tests/wheel-check sets it)")
class Installed(unittest.TestCase):
    def test_the_installed_copy_is_imported(self):
        import vmmarena

        self.assertEqual(os.path.dirname(os.path.realpath(vmmarena.__file__)), os.path.realpath(EXPECTED))

    def test_the_shim_inside_the_package_is_loaded(self):
        import vmmarena
        from vmmarena import _lib

        self.assertNotIn("VMMARENA_LIBRARY", os.environ)
        path = vmmarena.library_path()
        self.assertEqual(path, os.path.join(os.path.realpath(EXPECTED), "libvmmarena_torch.so"))
        self.assertEqual(_lib.loaded_path(), path)
        vmmarena.config_check()  # calls into the loaded shim

    def test_the_vmmarena_script(self):
        script = os.path.join(os.path.dirname(sys.executable), "vmmarena")
        r = subprocess.run([script, "library"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(os.path.realpath(EXPECTED), "libvmmarena_torch.so"))


if __name__ == "__main__":
    unittest.main()
