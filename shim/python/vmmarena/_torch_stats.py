"""PyTorch's CUDA memory statistics answered from vmmarena for use_as_default(), whose
allocator is PyTorch's pluggable one. (vmmarena.install() needs none of this: its native
allocator class answers getDeviceStats itself, from vmm_torch_native_stats.)

With a pluggable allocator PyTorch's own getDeviceStats raises "does not yet support
getDeviceStats". torch.cuda.memory_stats(), memory_allocated(), max_memory_allocated(),
memory_reserved(), max_memory_reserved(), memory_summary() and torch.accelerator's
statistics all read torch._C._cuda_memoryStats or torch._C._accelerator_getDeviceStats, and
the resets call torch._C._cuda_resetPeakMemoryStats and friends; patch() replaces those
bindings with functions over vmm_usage, and torch.cuda.get_per_process_memory_fraction's
(which PyTorch does not support for a pluggable allocator either) with the arena's limit over
the device's memory. The mapping (docs/torch.md, "Statistics"):

  allocated_bytes, active_bytes, requested_bytes   vmm_usage.allocated_bytes (+ peak): whole
                                                    mappings' extents and page slots handed out
  reserved_bytes                                    reserved_bytes (+ peak): physical memory held
  allocation, active                                allocations (+ peak), alloc_count, free_count
  num_ooms                                          refusals
  num_alloc_retries                                 cache_releases

Only "all" is filled; "small_pool", "large_pool", segments, inactive splits, oversize counts,
the device call counts and the cumulative byte counts ("allocated"/"freed" of the byte
statistics) are 0: vmmarena does not keep them. Nothing here imports torch.
"""

import threading

from . import _lib

STAT_KEYS = ("current", "peak", "allocated", "freed")
POOL_KEYS = ("all", "small_pool", "large_pool")
# (PyTorch's name, vmm_usage field of "current", of "peak") for the byte statistics.
_BYTES = (("allocated_bytes", "allocated_bytes", "allocated_peak_bytes"),
          ("active_bytes", "allocated_bytes", "allocated_peak_bytes"),
          ("requested_bytes", "allocated_bytes", "allocated_peak_bytes"),
          ("reserved_bytes", "reserved_bytes", "reserved_peak_bytes"))
_UNKEPT = ("segment", "inactive_split", "inactive_split_bytes")
# The counters reset_accumulated_memory_stats() starts again from 0.
ACCUMULATED = ("alloc_count", "free_count", "refusals", "cache_releases")

_baselines = {}  # device -> {counter: value at the last reset}
_baselines_lock = threading.Lock()


def _stat(current=0, peak=0, allocated=0, freed=0):
    return dict(zip(STAT_KEYS, (current, peak, allocated, freed)))


def _array(all_pools):
    """A StatArray: the values under "all", zeros for PyTorch's small and large pools."""
    return {"all": all_pools, "small_pool": _stat(), "large_pool": _stat()}


def device_stats(usage, baseline=None):
    """The nested dict torch._C._cuda_memoryStats returns, from a vmm_usage dict. `baseline`
    holds the ACCUMULATED counters at the last reset_accumulated_memory_stats()."""
    base = baseline or {}
    count = {key: usage[key] - base.get(key, 0) for key in ACCUMULATED}
    stats = {
        "num_alloc_retries": count["cache_releases"],
        "num_ooms": count["refusals"],
        "num_sync_all_streams": 0,
        "num_device_alloc": 0,
        "num_device_free": 0,
        "max_split_size": -1,
        "oversize_allocations": _stat(),
        "oversize_segments": _stat(),
    }
    allocations = _stat(usage["allocations"], usage["allocations_peak"], count["alloc_count"], count["free_count"])
    stats["allocation"] = _array(allocations)
    stats["active"] = _array(dict(allocations))
    for name, current, peak in _BYTES:
        stats[name] = _array(_stat(usage[current], usage[peak]))
    for name in _UNKEPT:
        stats[name] = _array(_stat())
    return stats


def memory_stats(device):
    with _baselines_lock:
        baseline = dict(_baselines.get(device, {}))
    return device_stats(_lib.usage(device), baseline)


def reset_peak_memory_stats(device):
    _lib.reset_peaks(device)


def reset_accumulated_memory_stats(device):
    now = _lib.usage(device)
    with _baselines_lock:
        _baselines[device] = {key: now[key] for key in ACCUMULATED}


# torch._C binding -> its replacement; the accelerator ones exist from PyTorch 2.9 on.
_BINDINGS = {
    "_cuda_getMemoryFraction": _lib.memory_fraction,
    "_cuda_memoryStats": memory_stats,
    "_cuda_resetPeakMemoryStats": reset_peak_memory_stats,
    "_cuda_resetAccumulatedMemoryStats": reset_accumulated_memory_stats,
    "_accelerator_getDeviceStats": memory_stats,
    "_accelerator_resetPeakStats": reset_peak_memory_stats,
    "_accelerator_resetAccumulatedStats": reset_accumulated_memory_stats,
}


def patch(torch):
    """Points PyTorch's statistics bindings at vmmarena; returns the names replaced."""
    replaced = []
    for name, replacement in _BINDINGS.items():
        if hasattr(torch._C, name):
            setattr(torch._C, name, replacement)
            replaced.append(name)
    return replaced
