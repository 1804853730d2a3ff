"""Whole-process mode: vmmarena as PyTorch's allocator for every tensor (vmmarena.install()).

install() makes the arenas caching ones (the core caches every free, carves small requests
from pages, keeps CUDA graphs' pools apart), builds a CUDAPluggableAllocator over the shim's
C++ malloc (which throws instead of handing PyTorch NULL) and vmm_torch_free, sets PyTorch's
hooks (graph pools, record_stream, empty_cache, memory fraction), swaps it in with
change_current_allocator, answers PyTorch's memory statistics from vmmarena, and makes
torch.cuda.graph's entry keep the cache (VMMARENA_GRAPH_EMPTY_CACHE). Storage's
context managers then set the kind of this thread's tensors (kind()). torch is imported only
by install().
"""

import contextlib
import ctypes
import os
import threading

from . import _lib, _torch_stats
from ._lib import VmmarenaConfigError, VmmarenaError

KIND_CODES = {"package": 0, "transient": 1}  # vmm_kind, as vmm_torch_set_kind takes it

# PyTorch hook setter -> the shim's symbol it gets.
HOOKS = {
    "set_begin_allocate_to_pool": "vmm_torch_process_begin_pool",
    "set_end_allocate_to_pool_fn": "vmm_torch_process_end_pool",
    "set_release_pool": "vmm_torch_process_release_pool",
    "set_record_stream_fn": "vmm_torch_process_record_stream",
    "set_reset_fn": "vmm_torch_process_empty_cache",
    "set_memory_fraction_fn": "vmm_torch_process_memory_fraction",
}
# torch._C bindings of the checkpointing of cudagraph trees (torch.compile mode="reduce-overhead"),
# which PyTorch does not support for a pluggable allocator.
CHECKPOINT_BINDINGS = ("_cuda_getCheckpointState", "_cuda_setCheckpointPoolState")

# What the empty_cache() that torch.cuda.graph makes as it enters does: "keep" (the default)
# or "release" (as any other empty_cache).
GRAPH_EMPTY_CACHE = "VMMARENA_GRAPH_EMPTY_CACHE"
GRAPH_EMPTY_CACHE_CHOICES = ("keep", "release")

_lock = threading.Lock()
_allocator = None  # the CUDAPluggableAllocator, kept for the process once installed


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


def _unsupported_checkpoint(*args, **kwargs):
    raise VmmarenaError(
        "the checkpointing of cudagraph trees (torch.compile mode='reduce-overhead') needs PyTorch's own caching "
        "allocator (getCheckpointState/setCheckpointPoolState), which PyTorch does not support for a pluggable "
        "allocator such as vmmarena.install(): use torch.compile without mode='reduce-overhead' "
        "(e.g. mode='max-autotune-no-cudagraphs'), capture graphs with torch.cuda.graph, or use vmmarena's MemPool "
        "mode (docs/torch.md)"
    )


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
    if not _lib.has_process_hooks(handle):
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


def _build_allocator(torch, handle):
    """The CUDAPluggableAllocator over the shim, with every hook set."""
    path = _lib.loaded_path()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_torch_process_malloc", "vmm_torch_free")
    hooks = allocator.allocator()
    missing = [setter for setter in HOOKS if not hasattr(hooks, setter)]
    if missing:
        raise VmmarenaError(f"PyTorch {torch.__version__}'s pluggable allocator lacks {', '.join(missing)}: "
                            "whole-process mode needs PyTorch 2.3 or later")
    for setter, symbol in HOOKS.items():
        getattr(hooks, setter)(ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value)
    return allocator


def answer_memory_queries(torch, pluggable):
    """For use_as_default(), whose pluggable allocator is made current without install():
    PyTorch's memory statistics and get_per_process_memory_fraction answer from vmmarena, and
    set_per_process_memory_fraction sets the arena's limit where the shim has its C++ part
    (without it PyTorch ignores the call, as it does for any pluggable allocator lacking the
    hook)."""
    handle = _lib.lib()
    hooks = pluggable.allocator()
    if _lib.has_process_hooks(handle) and hasattr(hooks, "set_memory_fraction_fn"):
        symbol = HOOKS["set_memory_fraction_fn"]
        hooks.set_memory_fraction_fn(ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value)
    _torch_stats.patch(torch)


def install():
    """Makes vmmarena PyTorch's allocator for every CUDA tensor of this process (whole-process
    mode; docs/torch.md). Must run before CUDA is initialized: right after `import torch`.
    Unless VMMARENA_GRAPH_EMPTY_CACHE=release, torch.cuda.graph's entry then keeps the cache
    for the capture to reuse (_keep_cache_on_graph_entry). A second call does nothing. Raises
    VmmarenaError saying why when CUDA is initialized already, when use_as_default() ran, when
    the shim lacks its C++ part or PyTorch its hooks, and VmmarenaConfigError (a ValueError)
    for a bad VMMARENA_* value."""
    global _allocator
    from ._storage import _torch

    torch = _torch()
    _lib.config_check()
    graph_empty_cache = _graph_empty_cache()
    with _lock:
        if _allocator is not None:
            return
        handle = _check_can_install(torch)
        allocator = _build_allocator(torch, handle)
        _lib.set_caching(True)
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            _lib.set_caching(False)
            raise VmmarenaError(f"install(): PyTorch refused to swap its allocator: {e}") from e
        _torch_stats.patch(torch)
        if graph_empty_cache == "keep":
            _keep_cache_on_graph_entry(torch, handle)
        for name in CHECKPOINT_BINDINGS:
            if hasattr(torch._C, name):
                setattr(torch._C, name, _unsupported_checkpoint)
        _allocator = allocator
