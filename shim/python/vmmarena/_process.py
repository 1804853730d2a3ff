"""Whole-process mode: vmmarena as PyTorch's allocator for every tensor (vmmarena.install()).

install() makes the arenas caching ones (the core caches every free, carves small requests
from pages, keeps CUDA graphs' and MemPools' pools apart) and makes vmmarena PyTorch's CUDA
allocator: a c10::cuda::CUDACachingAllocator::CUDAAllocator, the C++ class of
shim/torch_allocator/vmmarena_allocator.cpp, built against the installed PyTorch's headers by
build_native() (torch.utils.cpp_extension with ninja, on the first install() and cached per
PyTorch version and source hash under native_cache_dir()). PyTorch then answers memory_stats(),
memory_snapshot(), the memory history, out-of-memory errors, MemPools and the checkpointing of
cudagraph trees from vmmarena. torch.cuda.graph's entry keeps the cache
(VMMARENA_GRAPH_EMPTY_CACHE). Storage's context managers then set the kind of this thread's
tensors (kind()). torch is imported only by install() and build_native().

Building ahead of time (a machine without a compiler at run time, a read-only cache):
    vmmarena build-allocator
"""

import contextlib
import ctypes
import hashlib
import os
import shutil
import threading

from . import _lib, _program_order, _torch_stats
from ._lib import VmmarenaConfigError, VmmarenaError

KIND_CODES = {"package": 0, "transient": 1}  # vmm_kind, as vmm_torch_set_kind takes it

# The pluggable allocator hook use_as_default() sets (set_per_process_memory_fraction).
MEMORY_FRACTION_HOOK = ("set_memory_fraction_fn", "vmm_torch_process_memory_fraction")

# What the empty_cache() that torch.cuda.graph makes as it enters does: "keep" (the default)
# or "release" (as any other empty_cache).
GRAPH_EMPTY_CACHE = "VMMARENA_GRAPH_EMPTY_CACHE"
GRAPH_EMPTY_CACHE_CHOICES = ("keep", "release")

# The PyTorch versions (major.minor) whose allocator interface the class is written for.
NATIVE_TORCH_VERSIONS = ("2.11",)
# The class's source and the shim headers it includes: inside the installed package
# (vmmarena/native/, put there by pip install), or in a source checkout.
NATIVE_SOURCE = "vmmarena_allocator.cpp"
NATIVE_HEADERS = ("vmmarena_torch.h", "vmmarena_torch_process.h", "vmmarena_torch_ipc.h")
NATIVE_CACHE = "VMMARENA_NATIVE_CACHE"  # where builds are cached (default ~/.cache/vmmarena/native)

_lock = threading.Lock()
_allocator = None  # the native allocator module, kept for the process once installed
_native = {}  # cache key -> the loaded module


def installed():
    """Whether install() has made vmmarena PyTorch's allocator in this process."""
    return _allocator is not None


@contextlib.contextmanager
def kind(name):
    """Makes this thread's tensors `name` ("package" or "transient") memory for the block."""
    previous = _lib.set_kind(KIND_CODES[name])
    try:
        yield
    finally:
        _lib.set_kind(previous)


def current_kind():
    """This thread's kind for whole-process allocations: "package" or "transient"."""
    code = _lib.lib().vmm_torch_kind()
    return next(name for name, value in KIND_CODES.items() if value == code)


# ---- Building the native allocator ------------------------------------------------------------


def native_sources():
    """(the class's .cpp, the directory of the shim headers it includes), from the installed
    package or a source checkout; VmmarenaError when neither has them."""
    here = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(here, "native")
    checkout = os.path.normpath(os.path.join(here, "..", ".."))  # shim/
    for source, include in ((os.path.join(packaged, NATIVE_SOURCE), packaged),
                            (os.path.join(checkout, "torch_allocator", NATIVE_SOURCE), checkout)):
        if os.path.isfile(source) and all(os.path.isfile(os.path.join(include, h)) for h in NATIVE_HEADERS):
            return source, include
    raise VmmarenaError(f"the native allocator's source ({NATIVE_SOURCE} and {', '.join(NATIVE_HEADERS)}) is not in "
                        f"{packaged} nor in a source checkout: reinstall vmmarena (pip install .)")


def native_cache_dir():
    """Where build_native() keeps its builds: $VMMARENA_NATIVE_CACHE, else
    $XDG_CACHE_HOME/vmmarena/native, else ~/.cache/vmmarena/native."""
    env = os.environ.get(NATIVE_CACHE)
    if env:
        return os.path.abspath(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vmmarena", "native")


def _torch_minor(torch):
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _check_torch_version(torch):
    """VmmarenaError, in one line, for a PyTorch whose allocator interface the class is not
    written for."""
    if _torch_minor(torch) not in NATIVE_TORCH_VERSIONS:
        raise VmmarenaError(
            f"PyTorch {torch.__version__}: vmmarena's native allocator is written for the allocator interface of "
            f"PyTorch {', '.join(NATIVE_TORCH_VERSIONS)} (c10/cuda/CUDACachingAllocator.h); install torch "
            f"{NATIVE_TORCH_VERSIONS[-1]}, or keep PyTorch's allocator and use vmmarena's MemPool mode (Storage "
            "without vmmarena.install())")


def _check_buildable(torch, ext):
    """One VmmarenaError saying what is missing to build the class, and what to do."""
    _check_torch_version(torch)
    if not torch.version.cuda or not getattr(ext, "CUDA_HOME", None):
        raise VmmarenaError(
            "building vmmarena's native allocator needs a CUDA build of PyTorch and the CUDA toolkit's headers "
            f"(torch.version.cuda={torch.version.cuda!r}, CUDA_HOME={getattr(ext, 'CUDA_HOME', None)!r}): install "
            "the CUDA toolkit or set CUDA_HOME")
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        raise VmmarenaError(
            f"building vmmarena's native allocator needs a C++ compiler and {compiler!r} is not on PATH: install g++ "
            "(or set CXX), or build it ahead of time where one is (vmmarena build-allocator)")
    if not ext.is_ninja_available():
        raise VmmarenaError("building vmmarena's native allocator needs ninja, which is not on PATH: pip install ninja")


def _load_built(name, path):
    """The module of an earlier build (torch is imported, so its libraries are loaded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cache_key(torch, source, include):
    digest = hashlib.sha256()
    for path in [source] + [os.path.join(include, h) for h in NATIVE_HEADERS]:
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(torch.__version__.encode())
    digest.update(os.path.realpath(_lib.loaded_path()).encode())  # the build links to this very file
    return digest.hexdigest()[:16]


def build_native(verbose=False):
    """Builds (or loads from the cache) vmmarena's native PyTorch allocator for the installed
    PyTorch and returns its module; install() calls it. Raises VmmarenaError, in one line, when
    PyTorch is not the version the class is written for, when no compiler, ninja or CUDA
    headers are found, or when the build fails (the log is in the build directory)."""
    from ._storage import _torch

    torch = _torch()
    import torch.utils.cpp_extension as ext

    _check_torch_version(torch)
    source, include = native_sources()
    library = os.path.realpath(_lib.loaded_path())
    key = _cache_key(torch, source, include)
    if key in _native:
        return _native[key]
    name = f"vmmarena_native_{key}"
    build_dir = os.path.join(native_cache_dir(), f"torch-{torch.__version__}-{key}")
    built = os.path.join(build_dir, name + ".so")
    if os.path.isfile(built):  # built before (maybe ahead of time): no compiler needed
        try:
            _native[key] = _load_built(name, built)
            return _native[key]
        except ImportError:
            pass  # a broken build: build it again
    _check_buildable(torch, ext)
    os.makedirs(build_dir, exist_ok=True)
    libdir = os.path.dirname(library)
    try:
        module = ext.load(
            name=name,
            sources=[source],
            extra_include_paths=[include],
            extra_cflags=["-O2"],
            extra_ldflags=[f"-L{libdir}", f"-l:{os.path.basename(library)}", f"-Wl,-rpath,{libdir}"],
            build_directory=build_dir,
            with_cuda=True,
            verbose=verbose,
        )
    except Exception as e:  # the compiler's or loader's error: its first lines, and where the log is
        lines = [line for line in str(e).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines
        raise VmmarenaError(
            f"building vmmarena's native allocator for PyTorch {torch.__version__} in {build_dir} failed: "
            f"{' | '.join(errors[:3])[:600]} (rerun `vmmarena build-allocator --verbose` for the whole log)"
        ) from e
    _native[key] = module
    return module


# ---- install() --------------------------------------------------------------------------------


def _check_can_install(torch):
    from . import _storage

    if _storage.default_kind() is not None:
        raise VmmarenaError(
            f"install(): use_as_default({_storage.default_kind()!r}) already made vmmarena the allocator of this "
            "process without caching; whole-process mode cannot replace it"
        )
    if torch.cuda.is_initialized():
        raise VmmarenaError(
            "install() must run before CUDA is initialized, and torch.cuda.is_initialized() is already True: a CUDA "
            "tensor, stream, synchronize or memory query came first. Call vmmarena.install() right after "
            "`import torch`."
        )
    handle = _lib.lib()
    if not _lib.has_process_hooks(handle) or not hasattr(handle, "vmm_torch_native_alloc"):
        raise VmmarenaError(
            f"{_lib.loaded_path()} was built without its C++ part (shim/vmmarena_torch_process.cpp), which "
            "whole-process mode needs: install a C++ compiler (g++) and rebuild the shim (pip install . or CMake)"
        )
    return handle


def _graph_empty_cache():
    """VMMARENA_GRAPH_EMPTY_CACHE, checked: "keep" or "release"."""
    value = os.environ.get(GRAPH_EMPTY_CACHE, "keep")
    choice = value.strip().lower()
    if choice not in GRAPH_EMPTY_CACHE_CHOICES:
        raise VmmarenaConfigError(f'{GRAPH_EMPTY_CACHE}="{value}": expected keep or release')
    return choice


def _keep_cache_on_graph_entry(torch, handle):
    """torch.cuda.graph empties PyTorch's cache as it enters, so that the graph's private pool
    can have the memory the cache holds. A graph pool of vmmarena draws from vmmarena's cache
    itself, so during that entry empty_cache keeps the cache: the device (just synchronized by
    torch.cuda.graph) is quiesced instead, and the capture reuses what is cached rather than
    memory given back and created again. Every other empty_cache gives the cache back."""
    graph = torch.cuda.graph
    enter = graph.__enter__
    if getattr(enter, "_vmmarena_keeps_cache", False):
        return
    keep = handle.vmm_torch_process_keep_cache

    def __enter__(self):
        previous = keep(1)
        try:
            return enter(self)
        finally:
            keep(previous)

    __enter__._vmmarena_keeps_cache = True
    __enter__.__wrapped__ = enter
    graph.__enter__ = __enter__


def answer_memory_queries(torch, pluggable):
    """For use_as_default(), whose pluggable allocator is made current without install():
    PyTorch's memory statistics and get_per_process_memory_fraction answer from vmmarena, and
    set_per_process_memory_fraction sets the arena's limit where the shim has its C++ part
    (without it PyTorch ignores the call, as it does for any pluggable allocator lacking the
    hook). install() needs none of this: its class answers them itself."""
    handle = _lib.lib()
    hooks = pluggable.allocator()
    setter, symbol = MEMORY_FRACTION_HOOK
    if _lib.has_process_hooks(handle) and hasattr(hooks, setter):
        getattr(hooks, setter)(ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value)
    _torch_stats.patch(torch)


def install():
    """Makes vmmarena PyTorch's allocator for every CUDA tensor of this process (whole-process
    mode; docs/torch.md): builds (first time) or loads the native allocator class for the
    installed PyTorch (build_native()) and registers it where PyTorch looks the CUDA allocator
    up. Must run before CUDA is initialized: right after `import torch`. Unless
    VMMARENA_GRAPH_EMPTY_CACHE=release, torch.cuda.graph's entry then keeps the cache for the
    capture to reuse (_keep_cache_on_graph_entry), and torch.cuda.Event's record and wait tell
    vmmarena the stream order the program makes (_program_order). A second call does nothing. Raises
    VmmarenaError saying why when CUDA is initialized already, when use_as_default() ran, when
    the shim lacks its C++ part, or when the class cannot be built (no compiler, another
    PyTorch version), and VmmarenaConfigError (a ValueError) for a bad VMMARENA_* value."""
    global _allocator
    from ._storage import _torch

    torch = _torch()
    _lib.config_check()
    graph_empty_cache = _graph_empty_cache()
    with _lock:
        if _allocator is not None:
            return
        handle = _check_can_install(torch)
        module = build_native()
        _lib.set_caching(True)
        try:
            module.install(ctypes.cast(handle.vmm_torch_native_alloc, ctypes.c_void_p).value)
        except RuntimeError as e:
            _lib.set_caching(False)
            raise VmmarenaError(f"install(): {e}") from e
        if graph_empty_cache == "keep":
            _keep_cache_on_graph_entry(torch, handle)
        _program_order.learn(torch)
        _allocator = module
