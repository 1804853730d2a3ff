"""Storage: a device's package and transient memory, routed through PyTorch's MemPool.

PyTorch routes a thread's allocations to the first pool registered for it, so nested
`use_mem_pool` contexts do not nest. A Storage therefore keeps one routing stack per thread
and keeps only its top pool registered: entering a context suspends the one below it,
leaving it resumes it. torch is imported only when a method needs it.

In whole-process mode (vmmarena.install(), _process.py) there are no MemPools: package(),
transient() and graph() set the kind of this thread's tensors instead, and the methods that
empty PyTorch's cache go to vmmarena's.
"""

import contextlib
import json
import sys
import threading
import weakref

from . import _lib, _process
from ._lib import VmmarenaError

KINDS = ("package", "transient")
_ALLOC_SYMBOLS = {"package": "vmm_torch_package_allocate", "transient": "vmm_torch_transient_allocate"}

_allocators = {}  # kind -> CUDAPluggableAllocator; kept for the process (pools hold raw pointers)
_allocators_lock = threading.Lock()
_default_kind = None  # set by use_as_default()


def _torch():
    try:
        import torch
    except ImportError as e:
        raise VmmarenaError(f"PyTorch is needed for this call and could not be imported: {e}") from e
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        raise VmmarenaError(
            f"PyTorch {torch.__version__} has no torch.cuda.MemPool / use_mem_pool: "
            "vmmarena needs PyTorch 2.5 or later"
        )
    return torch


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"kind must be 'package' or 'transient', not {kind!r}")


def allocator(kind="package"):
    """The torch.cuda.memory.CUDAPluggableAllocator of `kind` ("package" or "transient"),
    made once per process. `allocator(kind).allocator()` is what torch.cuda.MemPool takes."""
    _check_kind(kind)
    with _allocators_lock:
        found = _allocators.get(kind)
        if found is None:
            torch = _torch()
            found = torch.cuda.memory.CUDAPluggableAllocator(
                _lib.loaded_path(), _ALLOC_SYMBOLS[kind], "vmm_torch_free"
            )
            _allocators[kind] = found
    return found


def default_kind():
    """The kind use_as_default() made the default, or None."""
    return _default_kind


def use_as_default(kind="package"):
    """Makes vmmarena PyTorch's allocator for every CUDA allocation of this process (as
    `kind` memory, with no caching layer). Must run before CUDA is initialized; afterwards
    package(), transient() and graph() are unavailable (they need PyTorch's caching
    allocator). PyTorch's memory statistics and memory fraction then answer from vmmarena
    (_process.answer_memory_queries)."""
    global _default_kind
    _check_kind(kind)
    torch = _torch()
    _lib.config_check()
    if _default_kind is not None:
        raise VmmarenaError(f"use_as_default() already ran (kind {_default_kind!r})")
    if _process.installed():
        raise VmmarenaError("use_as_default(): install() already made vmmarena PyTorch's allocator (whole-process mode)")
    if torch.cuda.is_initialized():
        raise VmmarenaError(
            "use_as_default() must run before CUDA is initialized, and torch.cuda.is_initialized() "
            "is already True: a CUDA tensor, stream, synchronize or memory query came first. "
            "Call it right after `import torch`."
        )
    try:
        torch.cuda.memory.change_current_allocator(allocator(kind))
    except RuntimeError as e:
        raise VmmarenaError(f"use_as_default(): PyTorch refused to swap its allocator: {e}") from e
    _process.answer_memory_queries(torch, allocator(kind))
    _default_kind = kind


def _device_index(device):
    if device is None:
        return _torch().cuda.current_device()
    if isinstance(device, bool):
        raise TypeError("device must be an int, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        kind, _, number = device.partition(":")
        if kind != "cuda" or (number and not number.isdigit()):
            raise ValueError(f"device {device!r}: expected 'cuda' or 'cuda:N'")
        index = int(number) if number else _torch().cuda.current_device()
    elif getattr(device, "type", None) == "cuda":
        index = device.index if device.index is not None else _torch().cuda.current_device()
    else:
        raise TypeError(f"device must be an int, 'cuda:N' or a CUDA torch.device, not {device!r}")
    if not 0 <= index < 64:
        raise ValueError(f"device {index} out of range (0..63)")
    return index


class Storage:
    """Package and transient memory of one CUDA device.

    Creating it checks the VMMARENA_* environment and raises VmmarenaConfigError (a
    ValueError) with the allocator's message if a value is bad. The device's arena is
    created on first use.
    """

    def __init__(self, device=None):
        self.device = _device_index(device)
        _lib.config_check()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._package_pool = None
        self._package_users = 0  # package() contexts open, all threads
        self._open_steps = 0  # transient() steps open, all threads
        self._strays = set()  # bases of transient mappings that outlived their step
        self._graph_pools = []  # (weakref to a graph, the pool it captured into)

    def __repr__(self):
        return f"vmmarena.Storage(device={self.device})"

    # ---- Routing stack --------------------------------------------------------------------

    def _stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _suspend_top(self):
        stack = self._stack()
        if stack and stack[-1]["route"] is not None:
            route, stack[-1]["route"] = stack[-1]["route"], None
            route.__exit__(None, None, None)

    def _resume_top(self, torch):
        stack = self._stack()
        if stack and stack[-1]["route"] is None:
            route = torch.cuda.use_mem_pool(stack[-1]["pool"], self.device)
            route.__enter__()
            stack[-1]["route"] = route

    def _push(self, torch, kind, pool):
        self._suspend_top()
        entry = {"kind": kind, "pool": pool, "route": None}
        self._stack().append(entry)
        self._resume_top(torch)
        return entry

    def _pop(self, entry):
        stack = self._stack()
        if not stack or stack[-1] is not entry:
            raise VmmarenaError(f"{entry['kind']}() contexts of {self!r} were exited out of order")
        self._suspend_top()
        stack.pop()

    def _require_pools(self):
        torch = _torch()
        if _default_kind is not None:
            raise VmmarenaError(
                f"use_as_default({_default_kind!r}) made vmmarena PyTorch's allocator: every allocation "
                "already goes to vmmarena, and package(), transient() and graph() need PyTorch's "
                "caching allocator, which that replaced"
            )
        return torch

    def _new_pool(self, torch, kind):
        with torch.cuda.device(self.device):
            return torch.cuda.MemPool(allocator(kind).allocator())

    def _package(self, torch):
        with self._lock:
            if self._package_pool is None:
                self._package_pool = self._new_pool(torch, "package")
            return self._package_pool

    def _drop_pools_of_dead_graphs(self):
        """Drops the pools of graphs that are gone. A graph releases its hold on its pool when
        it is destroyed; only then may the MemPool go (some PyTorch versions assert that a
        MemPool dies with no other user)."""
        with self._lock:
            self._graph_pools = [(graph, pool) for graph, pool in self._graph_pools if graph() is not None]

    def _empty_cache(self, torch):
        """torch.cuda.empty_cache() with this thread's routing suspended."""
        self._suspend_top()
        try:
            torch.cuda.empty_cache()
        finally:
            self._resume_top(torch)

    def _live_transient(self):
        snap = json.loads(_lib.snapshot_json(self.device))
        return {
            int(m["base"], 16)
            for m in snap["mappings"]
            if m["kind"] == "transient" and m["state"] == "live"
        }

    def _note(self, exc, text):
        if hasattr(exc, "add_note"):
            exc.add_note(f"vmmarena (device {self.device}): {text}")

    # ---- Whole-process mode ---------------------------------------------------------------

    def _kinds(self):
        """This thread's open package()/transient() kinds in whole-process mode, innermost last."""
        kinds = getattr(self._local, "kinds", None)
        if kinds is None:
            kinds = self._local.kinds = []
        return kinds

    @contextlib.contextmanager
    def _process_kind(self, kind):
        kinds = self._kinds()
        kinds.append(kind)
        try:
            with _process.kind(kind):
                yield self
        finally:
            kinds.pop()

    @contextlib.contextmanager
    def _process_graph(self, cuda_graph, kind, share_with, kwargs):
        """graph() in whole-process mode: torch.cuda.graph with this thread's kind set."""
        torch = _torch()
        if share_with is not None:
            kwargs["pool"] = share_with.pool()
        kinds = self._kinds()
        kind = kind or (kinds[-1] if kinds else "package")
        _check_kind(kind)
        with self._process_kind(kind), torch.cuda.graph(cuda_graph, **kwargs):
            yield cuda_graph

    # ---- Context managers -----------------------------------------------------------------

    def package(self):
        """Routes this thread's CUDA allocations to persistent (PACKAGE) memory: weights,
        caches, graph operands. One pool for the Storage's life; release() returns its free
        cached segments. In whole-process mode: this thread's tensors are PACKAGE memory."""
        if _process.installed():
            return self._process_kind("package")
        return self._pool_package()

    @contextlib.contextmanager
    def _pool_package(self):
        torch = self._require_pools()
        pool = self._package(torch)
        with self._lock:
            self._package_users += 1
        entry = self._push(torch, "package", pool)
        del pool
        try:
            yield self
        except torch.OutOfMemoryError as e:
            self._note(e, _lib.last_error(self.device))
            raise
        finally:
            try:
                self._pop(entry)
                self._resume_top(torch)
            finally:
                with self._lock:
                    self._package_users -= 1

    def transient(self):
        """One warmup or tuning step: this thread's allocations go to a fresh pool of
        TRANSIENT memory. On exit the device is synchronized and the pool is dropped, so
        PyTorch returns its segments to vmmarena (into vmmarena's pool inside
        retain_transient_backing()). Tensors kept past the step keep their segments; the
        snapshot lists them under "stray_transient". In whole-process mode: this thread's
        tensors are TRANSIENT memory (as they are outside any context), each freed to
        vmmarena's cache when PyTorch frees it; nothing happens on exit."""
        if _process.installed():
            return self._process_kind("transient")
        return self._pool_transient()

    @contextlib.contextmanager
    def _pool_transient(self):
        torch = self._require_pools()
        before = self._live_transient()
        entry = self._push(torch, "transient", self._new_pool(torch, "transient"))
        with self._lock:
            self._open_steps += 1
        error = None
        try:
            yield self
        except BaseException as e:
            error = e
            if isinstance(e, torch.OutOfMemoryError):
                self._note(e, _lib.last_error(self.device))
            raise
        finally:
            try:
                self._end_step(torch, entry, before, error)
            finally:
                with self._lock:
                    self._open_steps -= 1

    def _end_step(self, torch, entry, before, error):
        """Synchronizes, drops the step's pool, hands leftovers back, quiesces. A failure
        here is raised, unless the step itself failed: then it becomes a note on that error."""
        try:
            torch.cuda.synchronize(self.device)
            self._pop(entry)
            entry["pool"] = None  # the last reference: ~MemPool returns its free segments
            self._drop_pools_of_dead_graphs()
            left = self._live_transient() - before
            if left:
                # Where ~MemPool does not empty the pool's cache (it varies by version), its
                # free segments come back only through a full empty_cache().
                torch.cuda.empty_cache()
                left = self._live_transient() - before
            with self._lock:
                self._strays |= left
            _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))
        except Exception as cleanup_error:
            if error is None:
                raise
            self._note(error, f"ending the step also failed: {cleanup_error}")
        finally:
            self._resume_top(torch)

    @contextlib.contextmanager
    def retain_transient_backing(self):
        """A retention scope around a warmup catalog: transient frees keep their mappings in
        vmmarena's pool for later steps instead of releasing them. Normal exit finishes the
        scope (releases everything retained); an exception aborts it (no driver call for
        that memory until the arena is destroyed) and propagates. Retention is on by default
        only on integrated GPUs: set VMMARENA_RETAIN=on for discrete cards."""
        self.retention_begin()
        try:
            yield self
        except BaseException as e:
            status = _lib.lib().vmm_torch_retention_abort(self.device)
            if status != _lib.VMM_OK:
                self._note(e, f"aborting the retention scope failed too: {_lib.last_error(self.device)}")
            raise
        self._settle()
        self.retention_finish()

    def _settle(self):
        """Waits for the device and hands PyTorch's free cached transient segments back."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)
            if not _process.installed() and self._open_steps == 0 and self._live_transient():
                self._empty_cache(torch)
        _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))

    @contextlib.contextmanager
    def graph(self, cuda_graph, kind=None, share_with=None, **kwargs):
        """Captures CUDA work into `cuda_graph` (a torch.cuda.CUDAGraph) with its memory in a
        pool of its own, of `kind` (default: the kind of this thread's innermost open
        context, else "package"), kept until the graph is gone; release() then returns it.
        `share_with=other_graph` uses that graph's pool instead, as
        torch.cuda.graph(pool=other.pool()) would, for graphs replayed in capture order.
        This thread's open context is suspended during the capture (PyTorch would route the
        capture's allocations to it, or refuse to capture into it) and resumed after; the
        free cached blocks of this thread's open steps are given back first, as
        torch.cuda.graph() does with PyTorch's own cache. Other keyword arguments (stream,
        capture_error_mode) go to torch.cuda.graph.

        In whole-process mode it is torch.cuda.graph(cuda_graph, **kwargs) with this thread's
        kind set to `kind` during the capture; share_with=other_graph passes
        pool=other_graph.pool()."""
        if _process.installed():
            if "pool" in kwargs:
                raise TypeError("Storage.graph(): pass share_with= instead of pool=")
            with self._process_graph(cuda_graph, kind, share_with, kwargs):
                yield cuda_graph
            return
        torch = self._require_pools()
        if "pool" in kwargs:
            raise TypeError("Storage.graph() makes the graph's pool; pass kind= or share_with= instead of pool=")
        if share_with is not None:
            shared = [pool for graph, pool in self._graph_pools if graph() is share_with]
            if not shared:
                raise VmmarenaError("share_with: that graph was not captured through this Storage's graph()")
            pool = shared[-1]
        else:
            stack = self._stack()
            kind = kind or (stack[-1]["kind"] if stack else "package")
            _check_kind(kind)
            pool = self._new_pool(torch, kind)
        with self._lock:
            self._graph_pools.append((weakref.ref(cuda_graph), pool))
        self._suspend_top()
        try:
            self._release_step_caches(torch)
            with torch.cuda.graph(cuda_graph, pool=pool.id, **kwargs):
                yield cuda_graph
        finally:
            self._resume_top(torch)

    def _release_step_caches(self, torch):
        """Before a capture, gives back the free blocks PyTorch caches for this thread's open
        steps, as torch.cuda.graph() does for its own cache (its empty_cache() does not reach
        a MemPool that is still in use). Each open step continues in a fresh pool; the old
        pool's segments that hold no live tensor return to vmmarena now, the others when their
        last tensor is freed and the cache is next emptied. Without this a step holds its
        eager forwards' cache and the graph's memory at once. The arena is then quiesced, so
        that inside a retention scope the capture may take those mappings although they were
        freed on other streams (nothing can be ordered after a stream from a capturing one).
        Called with this thread's routing suspended."""
        steps = [entry for entry in self._stack() if entry["kind"] == "transient"]
        if not steps:
            return
        torch.cuda.synchronize(self.device)
        for entry in steps:
            entry["pool"] = self._new_pool(torch, "transient")  # the old pool's last reference goes
        _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))

    @contextlib.contextmanager
    def tag(self, name):
        """Labels the segments vmmarena hands out on this thread while the block runs (shown
        per mapping and per tag in the snapshot). PyTorch caches segments, so a tensor that
        fits a cached block keeps that block's tag. In whole-process mode every tensor made
        on this thread in the block carries the tag (vmmarena keeps tags apart)."""
        if not isinstance(name, str):
            raise TypeError(f"tag must be a str, not {type(name).__name__}")
        handle = _lib.lib()
        handle.vmm_torch_tag_push(name.encode())
        try:
            yield self
        finally:
            handle.vmm_torch_tag_pop()

    # ---- Pause and resume -----------------------------------------------------------------

    def pause(self, tag, backup=False):
        """Takes the physical memory of every live vmmarena mapping tagged `tag` (None: the
        untagged ones) away, keeping its addresses: tensors, graphs and pointers into it stay
        valid but must not be touched until resume(tag). With backup=True the contents are
        copied to host memory and back; otherwise they are dropped. Waits for the device
        first. Inside retain_transient_backing() the memory stays with vmmarena as idle
        handles that other allocations reuse; outside it goes back to the driver.

        PyTorch caches free blocks inside segments: a segment paused under a pool that is still
        allocating could hand a new tensor paused memory. Pause what no running code allocates
        from: a finished graph's pool, the package memory of weights or operands that the next
        phase does not touch (docs/torch.md, "Pause and resume"). In whole-process mode it
        takes exactly the tensors made under `tag`."""
        self._pause_or_resume(_lib.lib().vmm_torch_pause, tag, 1 if backup else 0)

    def resume(self, tag):
        """Maps memory back at the same addresses for everything paused under `tag` (and
        restores a backup). Raises VmmarenaError with the numbers if memory is refused; what
        was not resumed stays paused and a later resume() carries on."""
        self._pause_or_resume(_lib.lib().vmm_torch_resume, tag)

    @contextlib.contextmanager
    def paused(self, tag, backup=False):
        """pause(tag, backup) for the duration of the block; resume(tag) on the way out, also
        when the block raises."""
        self.pause(tag, backup)
        try:
            yield self
        finally:
            self.resume(tag)

    def _pause_or_resume(self, call, tag, *mode):
        if tag is not None and not isinstance(tag, str):
            raise TypeError(f"tag must be a str or None, not {type(tag).__name__}")
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)
        _lib.check(self.device, call(self.device, tag.encode() if tag is not None else None, *mode))

    # ---- Plain calls ----------------------------------------------------------------------

    def release(self):
        """Returns every free segment PyTorch caches for this Storage to vmmarena: waits for
        the device, drops the package pool's cache (a new pool is made on the next
        package()), empties PyTorch's cache and quiesces the arena. In whole-process mode:
        waits for the device and empties vmmarena's cache (torch.cuda.empty_cache())."""
        if _process.installed():
            self._process_release()
            return
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)
            with self._lock:
                if self._package_users == 0:
                    self._package_pool = None
            self._drop_pools_of_dead_graphs()
            self._empty_cache(torch)
        _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))
        live = self._live_transient()
        with self._lock:
            self._strays &= live

    def _process_release(self):
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))

    def snapshot(self):
        """The arena's snapshot (docs/snapshot.md) as a dict, plus "stray_transient": the live
        transient mappings outside any step (every one when no step is open; those that
        outlived an earlier step while one is). In whole-process mode, where every tensor
        outside package() is transient, "stray_transient" is left out and "mode" is
        "process"."""
        snap = json.loads(_lib.snapshot_json(self.device))
        if _process.installed():
            snap["mode"] = "process"
            return snap
        live = [m for m in snap["mappings"] if m["kind"] == "transient" and m["state"] == "live"]
        with self._lock:
            steps, strays = self._open_steps, set(self._strays)
        outside = live if steps == 0 else [m for m in live if int(m["base"], 16) in strays]
        snap["stray_transient"] = {
            "count": len(outside),
            "bytes": sum(m["extent"] for m in outside),
            "mappings": outside,
        }
        return snap

    def last_error(self):
        """The allocator's message for the latest failure on this device ("" if none)."""
        return _lib.last_error(self.device)

    def retention_begin(self):
        _lib.check(self.device, _lib.lib().vmm_torch_retention_begin(self.device))

    def retention_finish(self):
        _lib.check(self.device, _lib.lib().vmm_torch_retention_finish(self.device))

    def retention_abort(self):
        _lib.check(self.device, _lib.lib().vmm_torch_retention_abort(self.device))

    def quiesce(self):
        _lib.check(self.device, _lib.lib().vmm_torch_quiesce(self.device))

    def check(self):
        """Runs the arena's invariant checker; raises VmmarenaError saying what is broken."""
        import ctypes

        buf = ctypes.create_string_buffer(512)
        status = _lib.lib().vmm_torch_check(self.device, buf, len(buf))
        if status != _lib.VMM_OK:
            raise VmmarenaError(buf.value.decode() or _lib.last_error(self.device), status, _lib.status_name(status))
