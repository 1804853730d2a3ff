// The C++ hooks of whole-process mode: a malloc that throws on refusal, the graph-pool
// routing, record_stream, empty_cache (see vmmarena_torch_process.h). Over the shim's C entry
// points only; no PyTorch header.
#include "vmmarena_torch_process.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vmmarena.h"

namespace {

constexpr size_t kMessageCap = 1024;

struct Capture {
  vmm_torch_mempool_id id;
  uint64_t pool;
  vmm_torch_stream_filter filter;
};

struct PoolUse {
  uint64_t pool = 0;
  long uses = 0;
};

// The graph pools of one device. `underway` mirrors captures.size() for the lock-free check
// of the allocation path.
struct DevicePools {
  std::mutex lock;
  std::map<vmm_torch_mempool_id, PoolUse> pools;
  std::vector<Capture> captures;
  std::vector<uint64_t> waiting;  // released by PyTorch, not yet by the arena
  std::atomic<int> underway{0};
};

DevicePools devices[VMM_MAX_DEVICES];
std::atomic<uint64_t> next_pool{1};  // 0 is VMM_POOL_SHARED
thread_local bool keeping_cache = false;  // vmm_torch_process_keep_cache

bool valid(int device) { return device >= 0 && device < VMM_MAX_DEVICES; }

void forget_blocks();  // the native allocator's bookkeeping (below)

std::string pool_name(int device, const vmm_torch_mempool_id &id) {
  return "pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) + ") of device " +
         std::to_string(device);
}

// The pool of the first capture underway whose filter accepts `stream`; 0 when none does.
uint64_t route(int device, CUstream stream) {
  if (!valid(device)) return 0;
  DevicePools &d = devices[device];
  if (d.underway.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard<std::mutex> hold(d.lock);
  for (const Capture &c : d.captures)
    if (c.filter(stream)) return c.pool;
  return 0;
}

// Releases the waiting pools of a device with no capture underway (caller holds d.lock).
// A pool whose release failed in the driver (the wait) keeps waiting; any other refusal is
// final, and vmm_torch_last_error(device) keeps it.
void release_waiting_locked(int device, DevicePools &d) {
  if (!d.captures.empty() || d.waiting.empty()) return;
  std::vector<uint64_t> failed;
  for (uint64_t pool : d.waiting)
    if (vmm_torch_release_pool(device, pool) == VMM_ERR_DRIVER) failed.push_back(pool);
  d.waiting.swap(failed);
}

// empty_cache on this thread while it keeps the cache (torch.cuda.graph entering): the pools
// waiting are released as by any empty_cache, and each device with no capture underway is
// quiesced, so that every free is known complete and the capture can reuse the cache.
void keep_cache() {
  for (int device = 0; device < VMM_MAX_DEVICES; device++) {
    DevicePools &d = devices[device];
    std::lock_guard<std::mutex> hold(d.lock);
    release_waiting_locked(device, d);
    if (!d.captures.empty() || vmm_torch_quiesce_existing(device) == VMM_OK) continue;
    throw std::runtime_error("vmmarena: torch.cuda.empty_cache() keeping the cache for a CUDA graph: device " +
                             std::to_string(device) + ": " + vmm_torch_last_error(device));
  }
}

[[noreturn]] void throw_refusal(size_t size, int device, uint64_t pool, int status, const char *why) {
  char head[256];
  std::snprintf(head, sizeof head, "%s: vmmarena refused %zu bytes on device %d%s (%s): ",
                status == VMM_ERR_OUT_OF_MEMORY ? "CUDA out of memory" : "vmmarena allocation failed", size, device,
                pool ? " for a CUDA graph's pool" : "", vmm_torch_status_name(status));
  throw std::runtime_error(std::string(head) + why);
}

void copy_message(char *msg, size_t cap, const char *text) {
  if (msg && cap) std::snprintf(msg, cap, "%s", text);
}

// Runs a hook for the tests: 1 with what() in msg if it threw, else 0.
template <typename Hook>
int run_caught(Hook &&hook, char *msg, size_t cap) {
  try {
    hook();
  } catch (const std::exception &e) {
    copy_message(msg, cap, e.what());
    return 1;
  }
  copy_message(msg, cap, "");
  return 0;
}

}  // namespace

extern "C" {

void *vmm_torch_process_malloc(size_t size, int device, CUstream stream) {
  uint64_t pool = route(device, stream);
  void *out = nullptr;
  char why[kMessageCap];
  int status = vmm_torch_process_allocate(size, device, stream, pool, &out, why, sizeof why);
  if (status != VMM_OK) throw_refusal(size, device, pool, status, why);
  return out;
}

void vmm_torch_process_record_stream(void *ptr, CUstream stream) {
  char why[kMessageCap];
  if (vmm_torch_record_stream(ptr, stream, why, sizeof why) != VMM_OK)
    throw std::runtime_error(std::string("vmmarena: Tensor.record_stream: ") + why);
}

void vmm_torch_process_empty_cache(void) {
  if (keeping_cache) {
    keep_cache();
    return;
  }
  for (int device = 0; device < VMM_MAX_DEVICES; device++) {
    DevicePools &d = devices[device];
    std::lock_guard<std::mutex> hold(d.lock);
    if (!d.captures.empty())
      throw std::runtime_error("vmmarena: torch.cuda.empty_cache() while " + std::to_string(d.captures.size()) +
                               " CUDA graph capture(s) are underway on device " + std::to_string(device) +
                               ": nothing was released (releasing waits for the device's work)");
    release_waiting_locked(device, d);
  }
  char why[kMessageCap];
  if (vmm_torch_empty_cache(why, sizeof why) != VMM_OK)
    throw std::runtime_error(std::string("vmmarena: torch.cuda.empty_cache(): ") + why);
}

int vmm_torch_process_keep_cache(int keep) {
  bool previous = keeping_cache;
  keeping_cache = keep != 0;
  return previous;
}

void vmm_torch_process_memory_fraction(double fraction, int device) {
  char why[kMessageCap];
  if (vmm_torch_set_memory_fraction(device, fraction, why, sizeof why) != VMM_OK)
    throw std::runtime_error(std::string("vmmarena: torch.cuda.set_per_process_memory_fraction(): ") + why);
}

void vmm_torch_process_begin_pool(int device, vmm_torch_mempool_id id, vmm_torch_stream_filter filter) {
  if (!valid(device))
    throw std::runtime_error("vmmarena: beginAllocateToPool: device " + std::to_string(device) +
                             " out of range (0.." + std::to_string(VMM_MAX_DEVICES - 1) + ")");
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  for (const Capture &c : d.captures)
    if (c.id == id)
      throw std::runtime_error("vmmarena: beginAllocateToPool: " + pool_name(device, id) +
                               " is already being allocated to");
  PoolUse &use = d.pools[id];
  if (use.uses == 0) use.pool = next_pool.fetch_add(1);
  if (vmm_torch_capture_begin(device, use.pool) != VMM_OK) {
    std::string why = vmm_torch_last_error(device);
    if (use.uses == 0) d.pools.erase(id);
    throw std::runtime_error("vmmarena: beginAllocateToPool: " + pool_name(device, id) + ": " + why);
  }
  use.uses++;
  d.captures.push_back(Capture{id, use.pool, std::move(filter)});
  d.underway.store(static_cast<int>(d.captures.size()), std::memory_order_release);
}

void vmm_torch_process_end_pool(int device, vmm_torch_mempool_id id) {
  if (!valid(device)) return;
  DevicePools &d = devices[device];
  try {
    std::lock_guard<std::mutex> hold(d.lock);
    for (auto it = d.captures.begin(); it != d.captures.end(); ++it) {
      if (it->id == id) {
        (void)vmm_torch_capture_end(device, it->pool);  // a refusal stays in vmm_torch_last_error
        d.captures.erase(it);
        break;
      }
    }
    d.underway.store(static_cast<int>(d.captures.size()), std::memory_order_release);
    release_waiting_locked(device, d);
  } catch (...) {
    // Only host memory can run out here; the pools then wait for the next try.
  }
}

void vmm_torch_process_incref_pool(int device, vmm_torch_mempool_id id) {
  if (!valid(device))
    throw std::runtime_error("vmmarena: createOrIncrefPool: device " + std::to_string(device) + " out of range (0.." +
                             std::to_string(VMM_MAX_DEVICES - 1) + ")");
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  PoolUse &use = d.pools[id];
  if (use.uses == 0) use.pool = next_pool.fetch_add(1);
  use.uses++;
}

void vmm_torch_process_release_pool(int device, vmm_torch_mempool_id id) {
  if (!valid(device)) return;
  DevicePools &d = devices[device];
  try {
    std::lock_guard<std::mutex> hold(d.lock);
    auto it = d.pools.find(id);
    if (it == d.pools.end() || --it->second.uses > 0) return;
    d.waiting.push_back(it->second.pool);
    d.pools.erase(it);
    release_waiting_locked(device, d);
  } catch (...) {
    // As above: never throw into a destructor.
  }
}

// ---- Tests only -----------------------------------------------------------------------

int vmm_torch_process_test_malloc(size_t size, int device, CUstream stream, void **out, char *msg, size_t cap) {
  *out = nullptr;
  return run_caught([&] { *out = vmm_torch_process_malloc(size, device, stream); }, msg, cap);
}

int vmm_torch_process_test_record_stream(void *ptr, CUstream stream, char *msg, size_t cap) {
  return run_caught([&] { vmm_torch_process_record_stream(ptr, stream); }, msg, cap);
}

int vmm_torch_process_test_empty_cache(char *msg, size_t cap) {
  return run_caught([] { vmm_torch_process_empty_cache(); }, msg, cap);
}

int vmm_torch_process_test_memory_fraction(double fraction, int device, char *msg, size_t cap) {
  return run_caught([&] { vmm_torch_process_memory_fraction(fraction, device); }, msg, cap);
}

int vmm_torch_process_test_begin_pool(int device, unsigned long long first, unsigned long long second,
                                      vmm_torch_test_filter filter, void *ctx, char *msg, size_t cap) {
  vmm_torch_stream_filter wrapped = [filter, ctx](CUstream stream) { return filter(stream, ctx) != 0; };
  return run_caught([&] { vmm_torch_process_begin_pool(device, {first, second}, wrapped); }, msg, cap);
}

int vmm_torch_process_test_end_pool(int device, unsigned long long first, unsigned long long second, char *msg,
                                    size_t cap) {
  return run_caught([&] { vmm_torch_process_end_pool(device, {first, second}); }, msg, cap);
}

int vmm_torch_process_test_release_pool(int device, unsigned long long first, unsigned long long second, char *msg,
                                        size_t cap) {
  return run_caught([&] { vmm_torch_process_release_pool(device, {first, second}); }, msg, cap);
}

int vmm_torch_process_test_incref_pool(int device, unsigned long long first, unsigned long long second, char *msg,
                                       size_t cap) {
  return run_caught([&] { vmm_torch_process_incref_pool(device, {first, second}); }, msg, cap);
}

uint64_t vmm_torch_process_pool_of(int device, unsigned long long first, unsigned long long second, long *uses) {
  if (uses) *uses = 0;
  if (!valid(device)) return 0;
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  auto it = d.pools.find({first, second});
  if (it == d.pools.end()) return 0;
  if (uses) *uses = it->second.uses;
  return it->second.pool;
}

void vmm_torch_process_test_reset(void) {
  keeping_cache = false;
  forget_blocks();
  for (DevicePools &d : devices) {
    std::lock_guard<std::mutex> hold(d.lock);
    d.pools.clear();
    d.captures.clear();
    d.waiting.clear();
    d.underway.store(0, std::memory_order_release);
  }
}

int vmm_torch_process_captures(int device, int *waiting_releases) {
  if (waiting_releases) *waiting_releases = 0;
  if (!valid(device)) return 0;
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  if (waiting_releases) *waiting_releases = static_cast<int>(d.waiting.size());
  return static_cast<int>(d.captures.size());
}

}  // extern "C"

// ---- The native allocator's bookkeeping ----------------------------------------------------

namespace {

constexpr size_t kSmallSize = size_t(1) << 20;  // PyTorch's small pool: requests of 1 MiB or less

// An allocation of vmm_torch_native_alloc.
struct Block {
  size_t size;   // requested
  size_t bytes;  // held: the slot's size or the mapping's extent
  CUstream stream;
  uint64_t pool;
};

// What one device's native allocations are: live, or held for a checkpoint; and PyTorch's
// statistics that the arena does not keep (counts and requested bytes, split small/large).
struct DeviceBlocks {
  std::mutex lock;
  std::unordered_map<void *, Block> live;
  std::unordered_map<void *, Block> held;  // freed by PyTorch, kept for a checkpoint
  std::unordered_map<void *, int> pinned;  // checkpoints listing each pointer
  vmm_torch_stat allocation[3]{};
  vmm_torch_stat requested[3]{};
  vmm_torch_stat block_bytes[3]{};  // the bytes each allocation holds (slot size or extent)
  int64_t segment_peak[3]{};
  int64_t reserved_peak[3]{};  // small and large pool: the peaks of the split below ([0] unused)
  uint64_t ooms_base = 0, retries_base = 0;  // vmm_usage counters at the last reset
  int64_t held_bytes = 0;
};

DeviceBlocks blocks[VMM_MAX_DEVICES];
std::atomic<int> devices_used{0};  // 1 + the highest device that had a native allocation

int pool_type(size_t size) { return size <= kSmallSize ? 1 : 2; }

void stat_up(vmm_torch_stat &s, int64_t n) {
  s.current += n;
  s.peak = std::max(s.peak, s.current);
  s.allocated += n;
}

void stat_down(vmm_torch_stat &s, int64_t n) {
  s.current -= n;
  s.freed += n;
}

// An allocation begins or ends, in PyTorch's counts (caller holds d.lock).
void count_alloc(DeviceBlocks &d, const Block &b) {
  for (int t : {0, pool_type(b.size)}) {
    stat_up(d.allocation[t], 1);
    stat_up(d.requested[t], static_cast<int64_t>(b.size));
    stat_up(d.block_bytes[t], static_cast<int64_t>(b.bytes));
  }
}

void count_free(DeviceBlocks &d, const Block &b) {
  for (int t : {0, pool_type(b.size)}) {
    stat_down(d.allocation[t], 1);
    stat_down(d.requested[t], static_cast<int64_t>(b.size));
    stat_down(d.block_bytes[t], static_cast<int64_t>(b.bytes));
  }
}

void forget_blocks() {
  for (DeviceBlocks &d : blocks) {
    std::lock_guard<std::mutex> hold(d.lock);
    d.live.clear();
    d.held.clear();
    d.pinned.clear();
    std::memset(d.allocation, 0, sizeof d.allocation);
    std::memset(d.requested, 0, sizeof d.requested);
    std::memset(d.block_bytes, 0, sizeof d.block_bytes);
    std::memset(d.segment_peak, 0, sizeof d.segment_peak);
    std::memset(d.reserved_peak, 0, sizeof d.reserved_peak);
    d.ooms_base = d.retries_base = 0;
    d.held_bytes = 0;
  }
  devices_used.store(0);
}

void note_device(int device) {
  int used = devices_used.load();
  while (used <= device && !devices_used.compare_exchange_weak(used, device + 1)) {
  }
}

// Gives allocations back to the arena (no lock held); the first failure's message goes to msg.
int free_to_arena(int device, const std::vector<std::pair<void *, Block>> &list, char *msg, size_t cap) {
  int first = VMM_OK;
  char why[kMessageCap];
  for (const auto &entry : list) {
    int st = vmm_torch_process_free(entry.first, device, entry.second.stream, why, sizeof why);
    if (st != VMM_OK && first == VMM_OK) {
      first = st;
      copy_message(msg, cap, why);
    }
  }
  return first;
}

// The vmm_pool_id of PyTorch's pool on `device`, 0 when it has none.
uint64_t pool_id(int device, unsigned long long first, unsigned long long second) {
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  auto it = d.pools.find({first, second});
  return it == d.pools.end() ? 0 : it->second.pool;
}

template <typename... Args>
void format_message(char *msg, size_t cap, const char *fmt, Args... args) {
  if (msg && cap) std::snprintf(msg, cap, fmt, args...);
}

// One mapping of the arena's JSON inventory, as snapshot() needs it.
struct Mapping {
  uintptr_t base = 0;
  size_t extent = 0;
  uint64_t pool = 0;
  size_t slot_size = 0;
  bool paused = false;
};

// Reads the "mappings" array of the arena's JSON snapshot (docs/snapshot.md): one object per
// mapping, with string, number and null values. False when the text is not as expected.
bool parse_mappings(const char *json, std::vector<Mapping> *out) {
  const char *p = std::strstr(json, "\"mappings\":[");
  if (!p) return false;
  p += std::strlen("\"mappings\":[");
  auto skip_string = [](const char *q, std::string *text) -> const char * {  // q at the opening quote
    for (q++; *q && *q != '"'; q++) {
      if (*q == '\\' && q[1]) q++;
      if (text) text->push_back(*q);
    }
    return *q == '"' ? q + 1 : nullptr;
  };
  while (*p == '{') {
    Mapping m;
    p++;
    while (*p == '"') {
      std::string key, value;
      p = skip_string(p, &key);
      if (!p || *p != ':') return false;
      p++;
      if (*p == '"') {
        p = skip_string(p, &value);
        if (!p) return false;
      } else {
        while (*p && *p != ',' && *p != '}') value.push_back(*p++);
      }
      if (key == "base") m.base = static_cast<uintptr_t>(std::strtoull(value.c_str(), nullptr, 16));
      else if (key == "extent") m.extent = std::strtoull(value.c_str(), nullptr, 10);
      else if (key == "pool") m.pool = std::strtoull(value.c_str(), nullptr, 10);
      else if (key == "slot_size") m.slot_size = std::strtoull(value.c_str(), nullptr, 10);
      else if (key == "state") m.paused = value == "paused";
      if (*p == ',') p++;
    }
    if (*p != '}') return false;
    p++;
    out->push_back(m);
    if (*p == ',') p++;
  }
  return *p == ']';
}

}  // namespace

struct vmm_torch_checkpoint {
  int device;
  uint64_t pool;
  std::vector<std::pair<void *, Block>> blocks;
};

extern "C" {

int vmm_torch_native_alloc(size_t size, int device, CUstream stream, void **out, char *msg, size_t cap) {
  *out = nullptr;
  copy_message(msg, cap, "");
  if (!valid(device)) {
    format_message(msg, cap, "allocate %zu B on device %d: device ordinal out of range (vmmarena supports devices 0..%d)",
                   size, device, VMM_MAX_DEVICES - 1);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  if (size == 0) return VMM_OK;
  uint64_t pool = 0;
  try {
    pool = route(device, stream);
  } catch (const std::exception &e) {
    format_message(msg, cap, "allocate %zu B on device %d: choosing the pool: %s", size, device, e.what());
    return VMM_ERR_INVALID_ARGUMENT;
  }
  int status = vmm_torch_process_allocate(size, device, stream, pool, out, msg, cap);
  if (status != VMM_OK) return status;
  DeviceBlocks &d = blocks[device];
  try {
    std::lock_guard<std::mutex> hold(d.lock);
    size_t bytes = size;
    (void)vmm_torch_allocation_size(*out, device, &bytes);  // just handed out: it is live
    const Block b{size, bytes, stream, pool};
    d.live.emplace(*out, b);
    count_alloc(d, b);
  } catch (const std::exception &) {  // no host memory to remember it: give it back
    (void)vmm_torch_process_free(*out, device, stream, nullptr, 0);
    *out = nullptr;
    format_message(msg, cap, "allocate %zu B on device %d: no host memory to record the allocation", size, device);
    return VMM_ERR_OUT_OF_MEMORY;
  }
  note_device(device);
  return VMM_OK;
}

int vmm_torch_native_free(void *ptr, int *device, char *msg, size_t cap) {
  if (device) *device = -1;
  copy_message(msg, cap, "");
  if (!ptr) return VMM_OK;
  int used = devices_used.load();
  for (int dev = 0; dev < used; dev++) {
    DeviceBlocks &d = blocks[dev];
    Block b;
    {
      std::lock_guard<std::mutex> hold(d.lock);
      auto it = d.live.find(ptr);
      if (it == d.live.end()) continue;
      b = it->second;
      d.live.erase(it);
      count_free(d, b);
      if (device) *device = dev;
      if (d.pinned.count(ptr)) {  // a checkpoint lists it: kept for a restore
        d.held.emplace(ptr, b);
        d.held_bytes += static_cast<int64_t>(b.size);
        return VMM_OK;
      }
    }
    int status = vmm_torch_process_free(ptr, dev, b.stream, msg, cap);
    if (status != VMM_OK) {  // the arena keeps it live (a later free retries): so do we
      std::lock_guard<std::mutex> hold(d.lock);
      d.live.emplace(ptr, b);
      count_alloc(d, b);
    }
    return status;
  }
  format_message(msg, cap, "free(%p): not a live allocation of vmmarena's native allocator (never handed out, or freed twice)",
                 ptr);
  return VMM_ERR_UNKNOWN_POINTER;
}

int vmm_torch_native_lookup(void *ptr, int *device, void **base, size_t *size) {
  int used = devices_used.load();
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (int dev = 0; dev < used; dev++) {
    DeviceBlocks &d = blocks[dev];
    std::lock_guard<std::mutex> hold(d.lock);
    auto it = d.live.find(ptr);
    if (it == d.live.end()) {  // inside an allocation: look through them all
      it = std::find_if(d.live.begin(), d.live.end(), [p](const std::pair<void *const, Block> &e) {
        uintptr_t b = reinterpret_cast<uintptr_t>(e.first);
        return b <= p && p < b + e.second.size;
      });
      if (it == d.live.end()) continue;
    }
    if (device) *device = dev;
    if (base) *base = it->first;
    if (size) *size = it->second.size;
    return VMM_OK;
  }
  return VMM_ERR_UNKNOWN_POINTER;
}

int vmm_torch_native_stats(int device, vmm_torch_device_stats *out) {
  if (!valid(device) || !out) return VMM_ERR_INVALID_ARGUMENT;
  std::memset(out, 0, sizeof *out);
  vmm_usage u;
  vmm_snapshot s;
  int status = vmm_torch_usage(device, &u);
  if (status == VMM_OK) status = vmm_torch_arena_snapshot(device, &s);
  if (status != VMM_OK) return status;
  int64_t mappings = 0;
  for (const vmm_kind_stats &k : s.kind) mappings += static_cast<int64_t>(k.live_count + k.pooled_count + k.abandoned_count);
  const int64_t pages = static_cast<int64_t>(u.pages);
  const int64_t segments[3] = {mappings, pages, std::max<int64_t>(mappings - pages, 0)};
  DeviceBlocks &d = blocks[device];
  std::lock_guard<std::mutex> hold(d.lock);
  for (int t = 0; t < 3; t++) {
    out->allocation[t] = out->active[t] = d.allocation[t];
    out->requested_bytes[t] = d.requested[t];
    d.segment_peak[t] = std::max(d.segment_peak[t], segments[t]);
    out->segment[t] = vmm_torch_stat{segments[t], d.segment_peak[t], 0, 0};
    out->allocated_bytes[t] = d.block_bytes[t];
  }
  // The arena's own figures for "all": extents handed out, physical bytes held.
  out->allocated_bytes[0].current = static_cast<int64_t>(u.allocated_bytes);
  out->allocated_bytes[0].peak = static_cast<int64_t>(u.allocated_peak_bytes);
  out->reserved_bytes[0] = vmm_torch_stat{static_cast<int64_t>(u.reserved_bytes),
                                          static_cast<int64_t>(u.reserved_peak_bytes), 0, 0};
  // Split as the segments are: the small pool holds the carved pages (one granule each), the
  // large pool everything else the arena holds (whole mappings and idle cached handles).
  const int64_t small = std::min<int64_t>(pages * static_cast<int64_t>(s.granularity),
                                          static_cast<int64_t>(u.reserved_bytes));
  const int64_t split[2] = {small, static_cast<int64_t>(u.reserved_bytes) - small};
  for (int t = 1; t < 3; t++) {
    d.reserved_peak[t] = std::max(d.reserved_peak[t], split[t - 1]);
    out->reserved_bytes[t] = vmm_torch_stat{split[t - 1], d.reserved_peak[t], 0, 0};
  }
  for (int t = 0; t < 3; t++) out->active_bytes[t] = out->allocated_bytes[t];
  out->num_alloc_retries = static_cast<int64_t>(u.cache_releases - d.retries_base);
  out->num_ooms = static_cast<int64_t>(u.refusals - d.ooms_base);
  out->num_sync_all_streams = static_cast<int64_t>(s.driver[VMM_DRV_ctx_synchronize].calls);
  out->num_device_alloc = static_cast<int64_t>(s.driver[VMM_DRV_mem_create].calls);
  out->num_device_free = static_cast<int64_t>(s.driver[VMM_DRV_mem_release].calls);
  out->max_split_size = -1;
  out->cached_bytes = static_cast<int64_t>(u.cached_bytes);
  out->held_count = static_cast<int64_t>(d.held.size());
  out->held_bytes = d.held_bytes;
  return VMM_OK;
}

size_t vmm_torch_native_stats_size(void) { return sizeof(vmm_torch_device_stats); }

int vmm_torch_native_reset_peaks(int device) {
  if (!valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  int status = vmm_torch_reset_peaks(device);
  DeviceBlocks &d = blocks[device];
  std::lock_guard<std::mutex> hold(d.lock);
  for (int t = 0; t < 3; t++) {
    d.allocation[t].peak = d.allocation[t].current;
    d.requested[t].peak = d.requested[t].current;
    d.block_bytes[t].peak = d.block_bytes[t].current;
    d.segment_peak[t] = 0;  // the next query sets it to the current count
    d.reserved_peak[t] = 0;  // likewise
  }
  return status;
}

int vmm_torch_native_reset_accumulated(int device) {
  if (!valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_usage u;
  int status = vmm_torch_usage(device, &u);
  if (status != VMM_OK) return status;
  DeviceBlocks &d = blocks[device];
  std::lock_guard<std::mutex> hold(d.lock);
  for (int t = 0; t < 3; t++) {
    d.allocation[t].allocated = d.allocation[t].freed = 0;
    d.requested[t].allocated = d.requested[t].freed = 0;
    d.block_bytes[t].allocated = d.block_bytes[t].freed = 0;
  }
  d.ooms_base = u.refusals;
  d.retries_base = u.cache_releases;
  return VMM_OK;
}

int vmm_torch_native_pool_uses(int device, unsigned long long first, unsigned long long second) {
  if (!valid(device)) return 0;
  DevicePools &d = devices[device];
  std::lock_guard<std::mutex> hold(d.lock);
  auto it = d.pools.find({first, second});
  return it == d.pools.end() ? 0 : static_cast<int>(it->second.uses);
}

int vmm_torch_native_pool_live_equal(int device, unsigned long long first, unsigned long long second,
                                     void *const *ptrs, size_t n) {
  if (!valid(device)) return 0;
  std::unordered_set<void *> expected(ptrs, ptrs + n);
  uint64_t pool = pool_id(device, first, second);
  DeviceBlocks &d = blocks[device];
  std::lock_guard<std::mutex> hold(d.lock);
  size_t found = 0;
  if (pool) {
    for (const auto &entry : d.live) {
      if (entry.second.pool != pool) continue;
      if (!expected.count(entry.first)) return 0;
      found++;
    }
  }
  return found == expected.size() ? 1 : 0;
}

size_t vmm_torch_native_pool_live_count(int device, unsigned long long first, unsigned long long second) {
  if (!valid(device)) return 0;
  uint64_t pool = pool_id(device, first, second);
  if (!pool) return 0;
  DeviceBlocks &d = blocks[device];
  std::lock_guard<std::mutex> hold(d.lock);
  return static_cast<size_t>(std::count_if(d.live.begin(), d.live.end(), [pool](const std::pair<void *const, Block> &e) {
    return e.second.pool == pool;
  }));
}

int vmm_torch_native_checkpoint(int device, unsigned long long first, unsigned long long second,
                                vmm_torch_checkpoint **out, char *msg, size_t cap) {
  *out = nullptr;
  copy_message(msg, cap, "");
  if (!valid(device)) {
    format_message(msg, cap, "getCheckpointState: device %d out of range", device);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  uint64_t pool = pool_id(device, first, second);
  if (!pool) {
    format_message(msg, cap, "getCheckpointState: pool (%llu, %llu) of device %d is not in use (no capture, MemPool or "
                   "use_mem_pool holds it)", first, second, device);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  try {
    auto *c = new vmm_torch_checkpoint{device, pool, {}};
    DeviceBlocks &d = blocks[device];
    std::lock_guard<std::mutex> hold(d.lock);
    for (const auto &entry : d.live)
      if (entry.second.pool == pool) c->blocks.push_back(entry);
    for (const auto &entry : c->blocks) d.pinned[entry.first]++;
    *out = c;
  } catch (const std::exception &) {
    format_message(msg, cap, "getCheckpointState: no host memory");
    return VMM_ERR_OUT_OF_MEMORY;
  }
  return VMM_OK;
}

int vmm_torch_native_checkpoint_device(const vmm_torch_checkpoint *c) { return c ? c->device : -1; }

size_t vmm_torch_native_checkpoint_count(const vmm_torch_checkpoint *c) { return c ? c->blocks.size() : 0; }

void vmm_torch_native_checkpoint_drop(vmm_torch_checkpoint *c) {
  if (!c) return;
  std::vector<std::pair<void *, Block>> release;
  {
    DeviceBlocks &d = blocks[c->device];
    std::lock_guard<std::mutex> hold(d.lock);
    for (const auto &entry : c->blocks) {
      auto pin = d.pinned.find(entry.first);
      if (pin == d.pinned.end() || --pin->second > 0) continue;
      d.pinned.erase(pin);
      auto held = d.held.find(entry.first);
      if (held == d.held.end()) continue;
      release.push_back(*held);
      d.held_bytes -= static_cast<int64_t>(held->second.size);
      d.held.erase(held);
    }
  }
  (void)free_to_arena(c->device, release, nullptr, 0);  // a failure stays in vmm_torch_last_error
  delete c;
}

int vmm_torch_native_restore(vmm_torch_checkpoint *c, void **freed, size_t freed_cap, size_t *n_freed, void **allocd,
                             size_t allocd_cap, size_t *n_allocd, char *msg, size_t cap) {
  *n_freed = *n_allocd = 0;
  copy_message(msg, cap, "");
  if (!c) {
    format_message(msg, cap, "setCheckpointPoolState: no checkpoint");
    return VMM_ERR_INVALID_ARGUMENT;
  }
  std::vector<std::pair<void *, Block>> release;
  DeviceBlocks &d = blocks[c->device];
  {
    std::lock_guard<std::mutex> hold(d.lock);
    std::vector<void *> now;
    for (const auto &entry : d.live)
      if (entry.second.pool == c->pool) now.push_back(entry.first);
    if (now.size() > freed_cap || c->blocks.size() > allocd_cap) {
      format_message(msg, cap, "setCheckpointPoolState: room for %zu freed and %zu allocated pointers, %zu and %zu needed",
                     freed_cap, allocd_cap, now.size(), c->blocks.size());
      return VMM_ERR_INVALID_ARGUMENT;
    }
    std::unordered_set<void *> listed;
    for (const auto &entry : c->blocks) {
      auto live = d.live.find(entry.first);
      bool ok = live != d.live.end() ? live->second.pool == c->pool : d.held.count(entry.first) > 0;
      if (!ok) {
        format_message(msg, cap, "setCheckpointPoolState: the checkpoint's allocation %p (%zu B) of device %d is neither "
                       "live in its pool nor held for it", entry.first, entry.second.size, c->device);
        return VMM_ERR_INVALID_ARGUMENT;
      }
      listed.insert(entry.first);
    }
    for (void *ptr : now) {
      freed[(*n_freed)++] = ptr;
      if (listed.count(ptr)) continue;  // stays live: in both lists
      auto it = d.live.find(ptr);
      Block b = it->second;
      d.live.erase(it);
      count_free(d, b);
      if (d.pinned.count(ptr)) {
        d.held.emplace(ptr, b);
        d.held_bytes += static_cast<int64_t>(b.size);
      } else {
        release.emplace_back(ptr, b);
      }
    }
    for (const auto &entry : c->blocks) {
      allocd[(*n_allocd)++] = entry.first;
      if (d.live.count(entry.first)) continue;
      auto it = d.held.find(entry.first);
      d.live.emplace(entry.first, it->second);
      d.held_bytes -= static_cast<int64_t>(it->second.size);
      count_alloc(d, it->second);
      d.held.erase(it);
    }
  }
  return free_to_arena(c->device, release, msg, cap);
}

int vmm_torch_native_segments(int device, unsigned long long first, unsigned long long second, vmm_torch_segment *segs,
                              size_t seg_cap, size_t *n_seg, vmm_torch_block *out_blocks, size_t block_cap,
                              size_t *n_block, char *msg, size_t cap) {
  *n_seg = *n_block = 0;
  copy_message(msg, cap, "");
  if (!valid(device)) {
    format_message(msg, cap, "snapshot: device %d out of range", device);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  vmm_snapshot probe;
  int status = vmm_torch_arena_snapshot(device, &probe);
  if (status != VMM_OK || probe.granularity == 0) return status;  // no arena: nothing to list
  std::vector<Mapping> mappings;
  for (int attempt = 0; attempt < 4; attempt++) {
    size_t size = vmm_torch_snapshot_json_size(device) + 65536;
    std::vector<char> json(size);
    status = vmm_torch_snapshot_json(device, json.data(), json.size());
    if (status == VMM_ERR_INVALID_ARGUMENT) continue;  // grew meanwhile
    if (status != VMM_OK) {
      copy_message(msg, cap, vmm_torch_last_error(device));
      return status;
    }
    if (!parse_mappings(json.data(), &mappings)) {
      format_message(msg, cap, "snapshot: the arena's JSON inventory is not as docs/snapshot.md describes");
      return VMM_ERR_INVALID_ARGUMENT;
    }
    break;
  }
  uint64_t only = (first || second) ? pool_id(device, first, second) : 0;
  if ((first || second) && !only) return VMM_OK;  // an unknown pool has nothing
  std::map<uint64_t, vmm_torch_mempool_id> names;  // vmm_pool_id -> PyTorch's pool
  {
    DevicePools &p = devices[device];
    std::lock_guard<std::mutex> hold(p.lock);
    for (const auto &entry : p.pools) names[entry.second.pool] = entry.first;
  }
  struct Entry {
    uintptr_t address;
    Block block;
    int state;
  };
  std::vector<Entry> allocations;
  {
    DeviceBlocks &d = blocks[device];
    std::lock_guard<std::mutex> hold(d.lock);
    for (const auto &e : d.live) allocations.push_back({reinterpret_cast<uintptr_t>(e.first), e.second, 1});
    for (const auto &e : d.held) allocations.push_back({reinterpret_cast<uintptr_t>(e.first), e.second, 2});
  }
  std::sort(allocations.begin(), allocations.end(), [](const Entry &x, const Entry &y) { return x.address < y.address; });
  size_t next = 0;  // mappings come by base address, and never overlap
  for (const Mapping &m : mappings) {
    while (next < allocations.size() && allocations[next].address < m.base) next++;
    if (m.paused || (only && m.pool != only)) continue;
    vmm_torch_segment seg{};
    seg.address = m.base;
    seg.size = m.extent;
    auto name = names.find(m.pool);
    if (m.pool && name != names.end()) {
      seg.pool_first = name->second.first;
      seg.pool_second = name->second.second;
    }
    seg.is_page = m.slot_size != 0;
    seg.first_block = *n_block;
    uintptr_t at = m.base, end = m.base + m.extent;
    auto put = [&](const vmm_torch_block &b) {
      if (*n_block < block_cap) out_blocks[*n_block] = b;
      (*n_block)++;
      seg.block_count++;
    };
    for (size_t i = next; i < allocations.size() && allocations[i].address < end; i++) {
      const Entry &e = allocations[i];
      if (e.address < at) continue;  // inside the block before it: not two allocations of one range
      uintptr_t limit = end;
      if (i + 1 < allocations.size() && allocations[i + 1].address < end) limit = allocations[i + 1].address;
      size_t extent = m.slot_size ? m.slot_size : m.extent;  // a page's slot, or the whole mapping
      extent = std::max(extent, e.block.size);
      extent = std::min<size_t>(extent, limit - e.address);
      if (e.address > at) put({at, e.address - at, 0, 0});
      if (!seg.stream) seg.stream = e.block.stream;
      put({e.address, extent, e.block.size, e.state});
      at = e.address + extent;
    }
    if (at < end) put({at, end - at, 0, 0});
    if (*n_seg < seg_cap) segs[*n_seg] = seg;
    (*n_seg)++;
  }
  return VMM_OK;
}

}  // extern "C"
