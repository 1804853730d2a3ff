"""ctypes binding of libvmmarena_torch.so: finding it, prototypes, status codes, errors, and
the library's trace reader.

Nothing here imports torch.
"""

import ctypes
import ctypes.util
import functools
import os
import threading

LIBRARY_NAME = "libvmmarena_torch.so"
# What vmm_status_name answers for a value past the last status (include/vmmarena.h).
_STATUS_PAST_THE_END = "VMM_STATUS_UNKNOWN"
# Bytes for the trace reader's one-line message.
_TRACE_MESSAGE_CAP = 2048


class VmmarenaError(RuntimeError):
    """A vmmarena call failed. `status` is the vmm_status code, `status_name` its name
    ("VMM_ERR_SCOPE_STATE") and `message` the allocator's message, with its numbers."""

    def __init__(self, message, status=None, status_name=None):
        self.status = status
        self.status_name = status_name
        self.message = message
        super().__init__(f"{status_name}: {message}" if status_name else message)


class VmmarenaConfigError(VmmarenaError, ValueError):
    """A VMMARENA_* environment variable has a bad value; the message names it, the value and
    the rule the value broke."""


# Both are vmmarena.VmmarenaError and vmmarena.VmmarenaConfigError to their users: a traceback's
# last line names them so, not by this private module.
VmmarenaError.__module__ = VmmarenaConfigError.__module__ = "vmmarena"


_lock = threading.Lock()
_lib = None
_path = None
_status_codes = None


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


# The C++ part of the shim (whole-process mode), absent from a shim built without a C++
# compiler: (name, restype, argtypes).
_PROCESS_HOOKS = ("vmm_torch_process_malloc", "vmm_torch_process_record_stream", "vmm_torch_process_empty_cache",
                  "vmm_torch_process_memory_fraction", "vmm_torch_process_begin_pool", "vmm_torch_process_end_pool",
                  "vmm_torch_process_release_pool")


def _process_prototypes(handle):
    """Prototypes of the whole-process entry points: the C ones always, the C++ test helpers
    when the C++ part was built."""
    c_int, c_size, c_void, c_buf = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    c_u64, c_ull = ctypes.c_uint64, ctypes.c_ulonglong
    _prototype(handle, "vmm_torch_set_caching", c_int, c_int, c_buf, c_size)
    _prototype(handle, "vmm_torch_caching", c_int)
    _prototype(handle, "vmm_torch_set_kind", c_int, c_int)
    _prototype(handle, "vmm_torch_kind", c_int)
    _prototype(handle, "vmm_torch_process_allocate", c_int, c_size, c_int, c_void, c_u64, ctypes.POINTER(c_void),
               c_buf, c_size)
    _prototype(handle, "vmm_torch_record_stream", c_int, c_void, c_void, c_buf, c_size)
    _prototype(handle, "vmm_torch_stream_mark", c_u64, c_int, c_void)
    _prototype(handle, "vmm_torch_stream_waited", c_int, c_int, c_void, c_void, c_u64)
    _prototype(handle, "vmm_torch_release_pool", c_int, c_int, c_u64)
    _prototype(handle, "vmm_torch_empty_cache", c_int, c_buf, c_size)
    _prototype(handle, "vmm_torch_usage", c_int, c_int, ctypes.POINTER(Usage))
    _prototype(handle, "vmm_torch_usage_size", c_size)
    _prototype(handle, "vmm_torch_reset_peaks", c_int, c_int)
    _prototype(handle, "vmm_torch_set_memory_fraction", c_int, c_int, ctypes.c_double, c_buf, c_size)
    _prototype(handle, "vmm_torch_memory_fraction", c_int, c_int, ctypes.POINTER(ctypes.c_double), c_buf, c_size)
    if not has_process_hooks(handle):
        return
    _prototype(handle, "vmm_torch_process_test_malloc", c_int, c_size, c_int, c_void, ctypes.POINTER(c_void), c_buf,
               c_size)
    _prototype(handle, "vmm_torch_process_test_record_stream", c_int, c_void, c_void, c_buf, c_size)
    _prototype(handle, "vmm_torch_process_test_empty_cache", c_int, c_buf, c_size)
    _prototype(handle, "vmm_torch_process_keep_cache", c_int, c_int)
    _prototype(handle, "vmm_torch_process_test_memory_fraction", c_int, ctypes.c_double, c_int, c_buf, c_size)
    _prototype(handle, "vmm_torch_process_test_begin_pool", c_int, c_int, c_ull, c_ull, TEST_FILTER, c_void, c_buf,
               c_size)
    _prototype(handle, "vmm_torch_process_test_end_pool", c_int, c_int, c_ull, c_ull, c_buf, c_size)
    _prototype(handle, "vmm_torch_process_test_release_pool", c_int, c_int, c_ull, c_ull, c_buf, c_size)
    _prototype(handle, "vmm_torch_process_pool_of", c_u64, c_int, c_ull, c_ull, ctypes.POINTER(ctypes.c_long))
    _prototype(handle, "vmm_torch_process_captures", c_int, c_int, ctypes.POINTER(c_int))
    _prototype(handle, "vmm_torch_process_test_reset", None)


def has_process_hooks(handle=None):
    """Whether the shim was built with its C++ part (the hooks of whole-process mode)."""
    handle = handle if handle is not None else lib()
    return all(hasattr(handle, name) for name in _PROCESS_HOOKS)


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
            _prototype(handle, "vmm_torch_trace_open", c_int, c_str, ctypes.POINTER(c_void), c_buf, c_size)
            _prototype(handle, "vmm_torch_trace_records", c_size, c_void)
            _prototype(handle, "vmm_torch_trace_name", c_str, c_void)
            _prototype(handle, "vmm_torch_trace_next", c_int, c_void, ctypes.POINTER(TraceRecord),
                       ctypes.POINTER(c_size))
            _prototype(handle, "vmm_torch_trace_close", None, c_void)
            _prototype(handle, "vmm_torch_trace_record_size", c_size)
            _prototype(handle, "vmm_torch_trace_op_name", c_str, ctypes.c_int)
            _process_prototypes(handle)
            _lib, _path = handle, path
    return _lib


def loaded_path():
    """Path the library was loaded from (loading it if needed)."""
    lib()
    return _path


def status_name(status):
    return lib().vmm_torch_status_name(status).decode()


def status_codes():
    """{name: value} of every vmm_status, as the library names them (vmm_status_name)."""
    global _status_codes
    if _status_codes is None:
        codes = {}
        for value in range(256):  # a handful; the bound only guards against a broken library
            name = status_name(value)
            if name == _STATUS_PAST_THE_END:
                break
            codes[name] = value
        _status_codes = codes
    return _status_codes


def _code(name):
    return status_codes()[name]


def __getattr__(name):
    """The status codes as module attributes (_lib.VMM_OK, _lib.VMM_ERR_DRIVER, ...), read
    from the library on first use."""
    if name.startswith("VMM_") and name in status_codes():
        return status_codes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def last_error(device):
    """Message of the latest failure through the shim on `device` ("" if none)."""
    return lib().vmm_torch_last_error(device).decode(errors="replace")


def check(device, status):
    """Raises VmmarenaError for a non-zero status of a call on `device`."""
    if status != _code("VMM_OK"):
        raise VmmarenaError(last_error(device), status, status_name(status))


def config_check():
    """Parses the VMMARENA_* environment as the allocator will; raises VmmarenaConfigError
    (a ValueError) naming the variable and the value if one is bad."""
    buf = ctypes.create_string_buffer(1024)
    status = lib().vmm_torch_config_check(buf, len(buf))
    if status != _code("VMM_OK"):
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
        if status == _code("VMM_OK"):
            return buf.value.decode()
        if status != _code("VMM_ERR_INVALID_ARGUMENT"):
            check(device, status)
    check(device, status)


# ---- Whole-process mode --------------------------------------------------------------------


class Usage(ctypes.Structure):
    """vmm_usage (include/vmmarena.h): the arena's usage in the terms of PyTorch's statistics."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "allocated_bytes", "allocated_peak_bytes", "allocations", "allocations_peak", "reserved_bytes",
        "reserved_peak_bytes", "cached_bytes", "alloc_count", "free_count", "refusals", "cache_releases", "pages",
        "page_slots_used")]


# int (*)(CUstream, void *): the C filter of the tests' begin_pool.
TEST_FILTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def usage(device):
    """vmm_usage of `device`'s arena as a dict (zeros when it has no arena yet)."""
    handle = lib()
    if handle.vmm_torch_usage_size() != ctypes.sizeof(Usage):
        raise VmmarenaError(f"{_path}: vmm_usage has {handle.vmm_torch_usage_size()} bytes, this package's copy "
                            f"{ctypes.sizeof(Usage)}: the library and package differ")
    out = Usage()
    check(device, handle.vmm_torch_usage(device, ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in Usage._fields_}


def reset_peaks(device):
    check(device, lib().vmm_torch_reset_peaks(device))


def memory_fraction(device):
    """The share of `device`'s memory its arena may hold (its limit over the device's total
    memory); 1.0 with no limit. Creates the arena if it does not exist yet."""
    msg = ctypes.create_string_buffer(1024)
    out = ctypes.c_double()
    status = lib().vmm_torch_memory_fraction(device, ctypes.byref(out), msg, len(msg))
    if status != _code("VMM_OK"):
        raise VmmarenaError(msg.value.decode(errors="replace"), status, status_name(status))
    return out.value


def set_caching(on):
    """Makes the arenas created from now on caching ones; raises VmmarenaError once an arena
    exists with the other setting."""
    msg = ctypes.create_string_buffer(512)
    status = lib().vmm_torch_set_caching(1 if on else 0, msg, len(msg))
    if status != _code("VMM_OK"):
        raise VmmarenaError(msg.value.decode(errors="replace"), status, status_name(status))


def set_kind(kind):
    """Sets this thread's kind for whole-process allocations (0 package, 1 transient); returns
    the previous one."""
    previous = lib().vmm_torch_set_kind(kind)
    if previous < 0:
        raise ValueError(f"kind {kind!r}: expected 0 (package) or 1 (transient)")
    return previous


# ---- Trace files ----------------------------------------------------------------------------


class TraceRecord(ctypes.Structure):
    """vmm_trace_record (include/vmmarena/trace.h): op is a vmm_trace_op, kind a vmm_kind or
    -1, tag the decoded tag bytes, result a vmm_status, pool a vmm_pool_id (0 in version 1)."""

    _fields_ = [("t_ns", ctypes.c_uint64), ("op", ctypes.c_int), ("kind", ctypes.c_int),
                ("requested", ctypes.c_uint64), ("rounded", ctypes.c_uint64), ("ptr", ctypes.c_uint64),
                ("stream", ctypes.c_uint64), ("tag", ctypes.c_char * 256), ("result", ctypes.c_int),
                ("pool", ctypes.c_uint64)]


@functools.lru_cache(maxsize=None)
def trace_op_name(op):
    """A vmm_trace_op's name as a trace line writes it ("alloc", "set-limit", ...)."""
    return lib().vmm_torch_trace_op_name(op).decode()


class TraceFileError(VmmarenaError, ValueError):
    """The library's trace reader refused a file; the message is its one line, naming the
    file and, for a bad line, the line number."""


class TraceReader:
    """A trace file, read whole and checked by the library (vmm_trace_reader_open: plain or
    gzip, the header, every line). Iterating gives (line number, TraceRecord) in file order.
    `name` is the path as the library's messages write it; `records` the record count."""

    def __init__(self, path):
        handle = lib()
        if handle.vmm_torch_trace_record_size() != ctypes.sizeof(TraceRecord):
            raise VmmarenaError(f"{_path}: vmm_trace_record has {handle.vmm_torch_trace_record_size()} bytes, "
                                f"this package's copy {ctypes.sizeof(TraceRecord)}: the library and package differ")
        msg = ctypes.create_string_buffer(_TRACE_MESSAGE_CAP)
        reader = ctypes.c_void_p()
        status = handle.vmm_torch_trace_open(os.fsencode(path), ctypes.byref(reader), msg, len(msg))
        if status != _code("VMM_OK"):
            raise TraceFileError(msg.value.decode("ascii", errors="backslashreplace"), status, status_name(status))
        self._handle, self._reader = handle, reader
        self.name = handle.vmm_torch_trace_name(reader).decode("ascii", errors="backslashreplace")
        self.records = handle.vmm_torch_trace_records(reader)

    def __iter__(self):
        line = ctypes.c_size_t()
        while self._reader:
            record = TraceRecord()
            if not self._handle.vmm_torch_trace_next(self._reader, ctypes.byref(record), ctypes.byref(line)):
                return
            yield line.value, record

    def close(self):
        if self._reader:
            self._handle.vmm_torch_trace_close(self._reader)
            self._reader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
