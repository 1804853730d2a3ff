// The C++ hooks of whole-process mode: a malloc that throws on refusal, the graph-pool
// routing, record_stream, empty_cache (see vmmarena_torch_process.h). Over the shim's C entry
// points only; no PyTorch header.
#include "vmmarena_torch_process.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
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
