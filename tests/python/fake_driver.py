"""The fake driver for the shim's Python tests: libvmmarena_fake_driver.so (named by
VMMARENA_FAKE_DRIVER) through ctypes, and the environment each test starts from."""

import ctypes
import os

# The two settings that locate the libraries; every other VMMARENA_ setting is the test's own.
LOCATORS = ("VMMARENA_LIBRARY", "VMMARENA_FAKE_DRIVER")


def load():
    """The fake driver, with the prototypes of the calls the tests make."""
    fake = ctypes.CDLL(os.environ["VMMARENA_FAKE_DRIVER"])
    fake.fake_driver_reset.restype = ctypes.c_void_p
    fake.fake_driver_reset.argtypes = [ctypes.c_void_p]
    fake.fake_ledger_clean.restype = ctypes.c_int
    fake.fake_first_error.restype = ctypes.c_char_p
    fake.fake_set_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]
    fake.fake_set_event_lag.argtypes = [ctypes.c_uint64]
    fake.fake_advance_clock.argtypes = [ctypes.c_uint64]
    fake.fake_program_wait.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return fake


def _settings():
    return [k for k in os.environ if k.startswith("VMMARENA_") and k not in LOCATORS]


def clear_settings():
    """Removes every VMMARENA_ setting but the locators and turns logging off; returns what was
    removed, for restore_settings."""
    saved = {k: os.environ.pop(k) for k in _settings()}
    os.environ["VMMARENA_LOG"] = "off"
    return saved


def restore_settings(saved):
    """Puts back the settings clear_settings removed, and drops any set since."""
    for k in _settings():
        del os.environ[k]
    os.environ.update(saved)
