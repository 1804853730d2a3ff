"""ctypes binding of libvmmarena_torch.so: finding it, prototypes, status codes, errors.

Nothing here imports torch.
"""

import ctypes
import ctypes.util
import os
import threading

LIBRARY_NAME = "libvmmarena_torch.so"

# vmm_status values (include/vmmarena.h); names come from the library itself.
VMM_OK = 0
VMM_ERR_INVALID_ARGUMENT = 1
VMM_ERR_UNKNOWN_POINTER = 2
VMM_ERR_OUT_OF_MEMORY = 3
VMM_ERR_SCOPE_STATE = 4
VMM_ERR_DRIVER = 5
VMM_ERR_NO_DRIVER = 6


class VmmarenaError(RuntimeError):
    """A vmmarena call failed. `status` is the vmm_status code, `status_name` its name
    ("VMM_ERR_SCOPE_STATE") and `message` the allocator's message, with its numbers."""

    def __init__(self, message, status=None, status_name=None):
        self.status = status
        self.status_name = status_name
        self.message = message
        super().__init__(f"{status_name}: {message}" if status_name else message)


class VmmarenaConfigError(VmmarenaError, ValueError):
    """A VMMARENA_* environment variable has a bad value; the message names it and the value."""


_lock = threading.Lock()
_lib = None
_path = None


def library_path():
    """Path of libvmmarena_torch.so: $VMMARENA_LIBRARY, else the copy inside this package
    (a pip install puts it there), else the dynamic loader's search path."""
    env = os.environ.get("VMMARENA_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise VmmarenaError(f"VMMARENA_LIBRARY={env!r}: no such file")
        return os.path.abspath(env)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if os.path.isfile(here):
        return here
    found = ctypes.util.find_library("vmmarena_torch")
    if found:
        return found
    raise VmmarenaError(
        f"{LIBRARY_NAME} not found: set VMMARENA_LIBRARY to its path, copy it to {here}, "
        "or install it where the dynamic loader looks"
    )


def _prototype(lib, name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def lib():
    """The loaded library (loaded once, on first use)."""
    global _lib, _path
    with _lock:
        if _lib is None:
            path = library_path()
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise VmmarenaError(f"cannot load {path}: {e}") from e
            c_int, c_size, c_ssize = ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t
            c_void, c_buf, c_str = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p
            _prototype(handle, "vmm_torch_package_allocate", c_void, c_ssize, c_int, c_void)
            _prototype(handle, "vmm_torch_transient_allocate", c_void, c_ssize, c_int, c_void)
            _prototype(handle, "vmm_torch_free", None, c_void, c_ssize, c_int, c_void)
            for name in ("retention_begin", "retention_finish", "retention_abort", "quiesce"):
                _prototype(handle, "vmm_torch_" + name, c_int, c_int)
            _prototype(handle, "vmm_torch_snapshot_json", c_int, c_int, c_buf, c_size)
            _prototype(handle, "vmm_torch_snapshot_json_size", c_size, c_int)
            _prototype(handle, "vmm_torch_last_error", c_str, c_int)
            _prototype(handle, "vmm_torch_status_name", c_str, c_int)
            _prototype(handle, "vmm_torch_config_check", c_int, c_buf, c_size)
            _prototype(handle, "vmm_torch_check", c_int, c_int, c_buf, c_size)
            _prototype(handle, "vmm_torch_tag_push", None, c_str)
            _prototype(handle, "vmm_torch_tag_pop", None)
            _prototype(handle, "vmm_torch_pause", c_int, c_int, c_str, c_int)
            _prototype(handle, "vmm_torch_resume", c_int, c_int, c_str)
            _prototype(handle, "vmm_torch_set_driver_for_testing", c_int, c_void)
            _lib, _path = handle, path
    return _lib


def loaded_path():
    """Path the library was loaded from (loading it if needed)."""
    lib()
    return _path


def status_name(status):
    return lib().vmm_torch_status_name(status).decode()


def last_error(device):
    """Message of the latest failure through the shim on `device` ("" if none)."""
    return lib().vmm_torch_last_error(device).decode(errors="replace")


def check(device, status):
    """Raises VmmarenaError for a non-zero status of a call on `device`."""
    if status != VMM_OK:
        raise VmmarenaError(last_error(device), status, status_name(status))


def config_check():
    """Parses the VMMARENA_* environment as the allocator will; raises VmmarenaConfigError
    (a ValueError) naming the variable and the value if one is bad."""
    buf = ctypes.create_string_buffer(1024)
    status = lib().vmm_torch_config_check(buf, len(buf))
    if status != VMM_OK:
        raise VmmarenaConfigError(buf.value.decode(errors="replace"), status, status_name(status))


def snapshot_json(device):
    """The arena's JSON snapshot as text (the arena is created if it does not exist)."""
    handle = lib()
    for _ in range(4):
        needed = handle.vmm_torch_snapshot_json_size(device)
        if needed == 0:
            raise VmmarenaError(last_error(device), None, None)
        buf = ctypes.create_string_buffer(needed + 4096)
        status = handle.vmm_torch_snapshot_json(device, buf, len(buf))
        if status == VMM_OK:
            return buf.value.decode()
        if status != VMM_ERR_INVALID_ARGUMENT:
            check(device, status)
    check(device, status)
