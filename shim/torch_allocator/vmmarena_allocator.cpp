// vmmarena as PyTorch's CUDA allocator (whole-process mode, vmmarena.install()): a
// c10::cuda::CUDACachingAllocator::CUDAAllocator built against the installed PyTorch's headers
// by vmmarena._process.build_native() (torch.utils.cpp_extension, cached per PyTorch version and
// source hash), linked to the libvmmarena_torch.so the vmmarena package loaded.
//
// The class is thin: which memory serves a request, stream order and pools are decided in the
// core, and what an allocation is (device, size, stream, pool, checkpoints, statistics) is kept
// by the shim's C entry points (vmmarena_torch_process.h), which CI tests on the fake driver.
// What stays here is what needs PyTorch's types: DataPtrs with this class's raw deleter,
// c10::OutOfMemoryError with PyTorch's message and the observers, the memory history (its
// contexts are PyTorch objects), and the registration.
//
// Written for the allocator interface of PyTorch 2.11 (c10/cuda/CUDACachingAllocator.h).
//
// Messages are formatted with snprintf (text()), never with iostreams, and every TORCH_CHECK
// gets one string: the compiler that builds this module may link its own copy of libstdc++'s
// stream code into it (the GPU machine's /opt/gcc does), whose number formatting then meets
// the process's locale facets and crashes.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "vmmarena_torch_process.h"
#include "vmmarena_torch_ipc.h"

#if TORCH_VERSION_MAJOR != 2 || TORCH_VERSION_MINOR != 11
#error "vmmarena's native allocator is written for the allocator interface of PyTorch 2.11"
#endif

namespace vmmarena {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::TraceEntry;

constexpr size_t kMessageCap = 2048;
constexpr int kVmmOk = 0;                      // VMM_OK
constexpr uint64_t kOneExaByte = 1ULL << 60;   // PyTorch's own bound on one request

void raw_delete_fn(void* ptr);

std::string status_name(int status) {
  return vmm_torch_status_name(status);
}

// printf into a std::string (messages; see the top of the file).
std::string text(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string text(const char* fmt, ...) {
  char buf[2 * kMessageCap];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// A size as PyTorch's out-of-memory message writes it (c10::CachingAllocator::format_size).
std::string size_text(uint64_t size) {
  if (size <= 1024) return text("%llu bytes", static_cast<unsigned long long>(size));
  if (size <= 1048576) return text("%.2f KiB", static_cast<double>(size) / 1024.0);
  if (size <= 1073741824ULL) return text("%.2f MiB", static_cast<double>(size) / 1048576.0);
  return text("%.2f GiB", static_cast<double>(size) / 1073741824.0);
}

// The memory history (torch.cuda.memory._record_memory_history): trace entries per device in
// a ring of at most max_entries, and the context of each live allocation.
struct History {
  std::mutex lock;
  std::atomic<bool> enabled{false};
  cca::CreateContextFn recorder = nullptr;
  cca::RecordContext when = cca::RecordContext::NEVER;
  size_t max_entries = 0;
  std::array<bool, 16> skip{};  // by TraceEntry::Action
  std::vector<std::vector<TraceEntry>> traces;  // per device
  std::vector<size_t> next;                     // the oldest entry once a ring is full
  std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts;
  // Per device: address -> (order, bytes requested) of the allocations freed while recording;
  // PyTorch's inactive block keeps the requested_size of the last allocation freed into it.
  std::vector<std::map<uintptr_t, std::pair<uint64_t, size_t>>> freed;
  uint64_t freed_order = 0;
  std::string user_metadata;  // torch.cuda.memory._set_memory_metadata: on every entry from then on
};

// A checkpoint of a pool for cudagraph trees: the shim's list of the pool's live allocations.
struct Checkpoint : public cca::AllocatorState {
  Checkpoint(vmm_torch_checkpoint* c, c10::DeviceIndex d, MempoolId_t p) : checkpoint(c), device(d), pool(p) {}
  ~Checkpoint() override {
    vmm_torch_native_checkpoint_drop(checkpoint);
  }
  vmm_torch_checkpoint* checkpoint;
  c10::DeviceIndex device;
  MempoolId_t pool;
};

void fill(c10::CachingAllocator::Stat& to, const vmm_torch_stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void fill(c10::CachingAllocator::StatArray& to, const vmm_torch_stat (&from)[3]) {
  for (size_t t = 0; t < 3; t++) fill(to[t], from[t]);
}

class Allocator final : public cca::CUDAAllocator {
 public:
  using cca::CUDAAllocator::recordStream;

  // ---- Allocation ----------------------------------------------------------------------

  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* ptr = allocate_on(size, device, stream);
    return {ptr, ptr, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &raw_delete_fn;
  }

  void* raw_alloc(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    return allocate_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t size, cudaStream_t stream) override {
    return allocate_on(size, c10::cuda::current_device(), stream);
  }

  void raw_delete(void* ptr) override {
    char why[kMessageCap];
    int status = release(ptr, why);
    TORCH_CHECK(status == kVmmOk, text("vmmarena: raw_delete(%p): %s: %s", ptr, status_name(status).c_str(), why));
  }

  // The raw deleter of every DataPtr: never throws (it runs in destructors).
  void free_quietly(void* ptr) {
    char why[kMessageCap];
    int status = release(ptr, why);
    if (status != kVmmOk) TORCH_WARN(text("vmmarena: freeing %p: %s: %s", ptr, status_name(status).c_str(), why));
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- Lifecycle -------------------------------------------------------------------------

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_ = true;
  }

  bool initialized() override {
    return initialized_;
  }

  void enable(bool value) override {
    enabled_ = value;
  }

  bool isEnabled() const override {
    return enabled_;
  }

  std::string name() override {
    return "vmmarena";
  }

  // ---- Cache, streams, limits ------------------------------------------------------------

  void emptyCache(MempoolId_t mempool_id) override {
    // A pool's own cache (~MemPool empties it after its release) joined the shared cache when
    // the pool was released: there is nothing of it left to give back on its own.
    if (mempool_id.first != 0 || mempool_id.second != 0) return;
    bool history = history_.enabled.load();
    std::vector<std::vector<std::pair<uintptr_t, size_t>>> before;
    if (history)
      for (int device = 0; device < std::max(device_count_, 1); device++) before.push_back(segment_extents(device));
    try {
      vmm_torch_process_empty_cache();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, std::string(e.what()));
    }
    if (history) trace_segments_freed(before, gather(cca::RecordContext::ALL));
  }

  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> hold(history_.lock);
    history_.user_metadata = metadata;
  }

  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> hold(history_.lock);
    return history_.user_metadata;
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &raw_delete_fn) return;  // not ours: nothing to order
    char why[kMessageCap];
    int status = vmm_torch_record_stream(ptr.get(), stream.stream(), why, sizeof why);
    TORCH_CHECK(status == kVmmOk, std::string("vmmarena: Tensor.record_stream: ") + why);
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double fraction = 1.0;
    char why[kMessageCap];
    int status = vmm_torch_memory_fraction(device, &fraction, why, sizeof why);
    TORCH_CHECK(status == kVmmOk, std::string("vmmarena: get_per_process_memory_fraction: ") + why);
    return fraction;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    char why[kMessageCap];
    int status = vmm_torch_set_memory_fraction(device, fraction, why, sizeof why);
    TORCH_CHECK(status == kVmmOk, std::string("vmmarena: set_per_process_memory_fraction: ") + why);
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex /*device*/) override {
    return {};  // no expandable segments: every mapping is sized to its request
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    // What one request could get without an error: the device's free memory and what the
    // arena caches (idle handles are assembled into one mapping).
    size_t free_bytes = 0, total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    }
    vmm_torch_device_stats s;
    TORCH_CHECK(vmm_torch_native_stats(device, &s) == kVmmOk, text("vmmarena: cacheInfo: device %d out of range", int(device)));
    *largest = free_bytes + static_cast<size_t>(s.cached_bytes);
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    void* base = nullptr;
    size_t extent = 0;
    int status = vmm_torch_native_lookup(ptr, nullptr, &base, &extent);
    TORCH_CHECK(status == kVmmOk, text("vmmarena: getBaseAllocation(%p): not inside a live allocation of vmmarena", ptr));
    if (size) *size = extent;
    return base;
  }

  // ---- Statistics (memory_stats, torch.accelerator.memory_*) -----------------------------

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    vmm_torch_device_stats s;
    TORCH_CHECK(vmm_torch_native_stats(device, &s) == kVmmOk, text("vmmarena: memory_stats: device %d out of range", int(device)));
    DeviceStats out;
    fill(out.allocation, s.allocation);
    fill(out.segment, s.segment);
    fill(out.active, s.active);
    fill(out.inactive_split, s.inactive_split);
    fill(out.allocated_bytes, s.allocated_bytes);
    fill(out.reserved_bytes, s.reserved_bytes);
    fill(out.active_bytes, s.active_bytes);
    fill(out.inactive_split_bytes, s.inactive_split_bytes);
    fill(out.requested_bytes, s.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    fill(out.oversize_allocations, s.oversize_allocations);
    fill(out.oversize_segments, s.oversize_segments);
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.max_split_size = s.max_split_size;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    TORCH_CHECK(vmm_torch_native_reset_accumulated(device) == kVmmOk,
                std::string("vmmarena: reset_accumulated_memory_stats: ") + vmm_torch_last_error(device));
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    TORCH_CHECK(vmm_torch_native_reset_peaks(device) == kVmmOk,
                std::string("vmmarena: reset_peak_memory_stats: ") + vmm_torch_last_error(device));
  }

  // ---- Graph pools and torch.cuda.MemPool ------------------------------------------------

  void beginAllocateToPool(c10::DeviceIndex device, MempoolId_t id, std::function<bool(cudaStream_t)> filter) override {
    try {
      vmm_torch_process_begin_pool(device, id, std::move(filter));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, std::string(e.what()));
    }
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t id) override {
    vmm_torch_process_end_pool(device, id);
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t id) override {
    vmm_torch_process_release_pool(device, id);
  }

  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t id, std::shared_ptr<CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator || allocator.get() == this,
                "vmmarena: torch.cuda.MemPool(allocator=" + (allocator ? allocator->name() : std::string()) +
                    ") under vmmarena.install(): every CUDA allocation of this process comes from vmmarena, so a pool "
                    "cannot route to another allocator. Use torch.cuda.MemPool() without an allocator (its memory is "
                    "kept apart in vmmarena), or do not call vmmarena.install()");
    try {
      vmm_torch_process_incref_pool(device, id);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, std::string(e.what()));
    }
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t id) override {
    return vmm_torch_native_pool_uses(device, id.first, id.second);
  }

  void setUseOnOOM(c10::DeviceIndex /*device*/, MempoolId_t /*id*/, bool use_on_oom) override {
    TORCH_CHECK(!use_on_oom,
                "vmmarena: torch.cuda.MemPool(use_on_oom=True) is not supported under vmmarena.install(): a pool's "
                "memory serves only that pool until it is released (then it joins the shared cache)");
  }

  void setNoSplit(c10::DeviceIndex /*device*/, MempoolId_t /*id*/) override {
    // vmmarena never splits a mapping between allocations (pages are carved into equal slots).
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    std::vector<void*> ptrs(expected.begin(), expected.end());
    return vmm_torch_native_pool_live_equal(device, id.first, id.second, ptrs.data(), ptrs.size()) == 1;
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    vmm_torch_checkpoint* c = nullptr;
    char why[kMessageCap];
    int status = vmm_torch_native_checkpoint(device, id.first, id.second, &c, why, sizeof why);
    TORCH_CHECK(status == kVmmOk, std::string("vmmarena: ") + why);
    return std::make_shared<Checkpoint>(c, device, id);
  }

  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) override {
    auto* state = dynamic_cast<Checkpoint*>(pps.get());
    TORCH_CHECK(state, "vmmarena: setCheckpointPoolState: the state is not one vmmarena's getCheckpointState made");
    TORCH_CHECK(state->device == device, text("vmmarena: setCheckpointPoolState: a checkpoint of device %d restored on "
                                              "device %d", int(state->device), int(device)));
    size_t listed = vmm_torch_native_checkpoint_count(state->checkpoint);
    size_t live = vmm_torch_native_pool_live_count(device, state->pool.first, state->pool.second);
    std::vector<void*> freed(live + 1), allocd(listed + 1);
    size_t n_freed = 0, n_allocd = 0;
    char why[kMessageCap];
    int status = vmm_torch_native_restore(state->checkpoint, freed.data(), freed.size(), &n_freed, allocd.data(),
                                          allocd.size(), &n_allocd, why, sizeof why);
    TORCH_CHECK(status == kVmmOk, std::string("vmmarena: ") + why);
    cca::CheckpointDelta delta;
    delta.ptrs_freed.assign(freed.begin(), freed.begin() + n_freed);
    for (size_t i = 0; i < n_allocd; i++)
      delta.dataptrs_allocd.emplace_back(allocd[i], allocd[i], &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, device));
    return delta;
  }

  // ---- Memory history and snapshot -------------------------------------------------------

  bool isHistoryEnabled() override {
    return history_.enabled.load();
  }

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clear_history, const std::vector<std::string>& skip_actions) override {
    std::lock_guard<std::mutex> hold(history_.lock);
    history_.recorder = context_recorder;
    history_.when = when;
    history_.max_entries = std::max<size_t>(alloc_trace_max_entries, 1);
    history_.skip.fill(false);
    for (const std::string& action : skip_actions)
      history_.skip[static_cast<size_t>(c10::CachingDeviceAllocator::parseTraceEntryAction(action))] = true;
    if (!enabled || clear_history) {  // as PyTorch's allocator: turning the history off clears it
      history_.traces.clear();
      history_.next.clear();
    }
    if (!enabled) {
      history_.contexts.clear();
      history_.freed.clear();
    }
    history_.enabled.store(enabled);  // with context NEVER the entries are kept, without frames (as PyTorch)
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> hold(observers_lock_);
    observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    // Kept for the calls that attach one (NCCL's memory registration); vmmarena reports no
    // segment events to them: its mappings are created and unmapped inside the core.
    std::lock_guard<std::mutex> hold(observers_lock_);
    trackers_.push_back(std::move(tracker));
  }

  cca::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo info;
    int devices = std::max(device_count_, 1);
    for (int device = 0; device < devices; device++) add_segments(device, mempool_id, &info.segments);
    info.device_traces.resize(devices);
    if (include_traces) {
      std::lock_guard<std::mutex> hold(history_.lock);
      for (size_t d = 0; d < history_.traces.size() && d < info.device_traces.size(); d++) {
        const auto& ring = history_.traces[d];
        size_t start = history_.next[d];
        for (size_t i = 0; i < ring.size(); i++) info.device_traces[d].push_back(ring[(start + i) % ring.size()]);
      }
    }
    info.config_metadata.garbage_collection_threshold = 0;
    info.config_metadata.max_split_size = SIZE_MAX;
    info.config_metadata.pinned_num_register_threads = 1;
    info.config_metadata.expandable_segments = false;
    info.config_metadata.release_lock_on_malloc = false;
    info.config_metadata.pinned_use_host_register = false;
    info.config_metadata.graph_capture_record_stream_reuse = false;
    info.config_metadata.last_allocator_settings = "vmmarena";
    return info;
  }

  // ---- Not supported ---------------------------------------------------------------------

  // ---- CUDA IPC (torch.multiprocessing): vmmarena_torch_ipc.h says the handle's format ----

  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    int device = -1;
    void* base = nullptr;
    TORCH_CHECK(vmm_torch_native_lookup(ptr, &device, &base, nullptr) == kVmmOk,
                text("vmmarena: shareIpcHandle(%p): not inside a live allocation of vmmarena", ptr));
    std::string handle(64 + 24 * VMM_TORCH_IPC_MAX_PIECES, '\0');
    size_t len = 0, offset = 0;
    char msg[kMessageCap] = "";
    int status = vmm_torch_ipc_share(base, device, handle.data(), handle.size(), &len, &offset, msg, sizeof msg);
    TORCH_CHECK(status == kVmmOk, text("vmmarena: sharing the allocation at %p of device %d with another process "
                                       "(CUDA IPC) failed (%s): %s", base, device, status_name(status).c_str(), msg));
    handle.resize(len);
    // The offset of base in the shared range; PyTorch adds that of ptr in the allocation.
    return cca::ShareableHandle{static_cast<ptrdiff_t>(offset), std::move(handle)};
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    TORCH_CHECK(vmm_torch_ipc_is_ours(handle.data(), handle.size()),
                text("vmmarena: this CUDA IPC handle (%zu bytes) was not made by vmmarena: the sending process runs "
                     "PyTorch's own allocator, and under vmmarena.install() only tensors of processes that also run "
                     "vmmarena.install() can be opened; run both under vmmarena.install(), or neither",
                     handle.size()));
    std::lock_guard<std::mutex> hold(ipc_lock_);
    auto known = ipc_open_.find(handle);
    if (known != ipc_open_.end()) {
      if (auto open = known->second.lock()) return open;  // opened already: one mapping per handle
    }
    int device = c10::cuda::current_device();
    void* base = nullptr;
    char msg[kMessageCap] = "";
    int status = vmm_torch_ipc_open(handle.data(), handle.size(), device, &base, msg, sizeof msg);
    TORCH_CHECK(status == kVmmOk, text("vmmarena: opening a CUDA tensor shared by another process on device %d "
                                       "failed (%s): %s", device, status_name(status).c_str(), msg));
    std::shared_ptr<void> open(base, [this, handle, device](void* p) {
      char m[kMessageCap] = "";
      {
        std::lock_guard<std::mutex> h(ipc_lock_);
        auto it = ipc_open_.find(handle);
        if (it != ipc_open_.end() && it->second.expired()) ipc_open_.erase(it);
      }
      if (vmm_torch_ipc_close(device, p, m, sizeof m) != kVmmOk)
        std::fprintf(stderr, "vmmarena: closing a CUDA tensor shared by another process: %s\n", m);
    });
    ipc_open_[handle] = open;
    return open;
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }

  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dst_device == src_device)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

 private:
  void* allocate_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) return nullptr;
    std::shared_ptr<c10::GatheredContext> context = gather(cca::RecordContext::STATE);
    // PyTorch traces a segment_alloc, with this request's context, when the request made it
    // cudaMalloc (DeviceCachingAllocator::alloc_block): the arena's mappings before and after.
    vmm_torch_device_stats before{};
    const bool counted = history_.enabled.load() && vmm_torch_native_stats(device, &before) == kVmmOk;
    void* ptr = nullptr;
    char why[kMessageCap];
    int status = size >= kOneExaByte ? -1 : vmm_torch_native_alloc(size, device, stream, &ptr, why, sizeof why);
    if (status != kVmmOk) out_of_memory(size, device, stream, status, why);
    if (history_.enabled.load()) {
      const std::pair<uintptr_t, size_t> created = counted ? segment_created(device, ptr, before) : std::pair<uintptr_t, size_t>{0, 0};
      std::lock_guard<std::mutex> hold(history_.lock);
      std::shared_ptr<c10::GatheredContext> traced = history_.when >= cca::RecordContext::ALLOC ? context : nullptr;
      if (history_.when >= cca::RecordContext::STATE && context) history_.contexts[ptr] = context;
      if (static_cast<size_t>(device) < history_.freed.size()) history_.freed[device].erase(reinterpret_cast<uintptr_t>(ptr));
      if (created.second)
        trace(TraceEntry::SEGMENT_ALLOC, device, created.first, created.second, stream, traced);
      trace(TraceEntry::ALLOC, device, reinterpret_cast<size_t>(ptr), size, stream, std::move(traced));
    }
    return ptr;
  }

  int release(void* ptr, char (&why)[kMessageCap]) {
    why[0] = '\0';
    if (!ptr) return kVmmOk;
    size_t size = 0;
    int device = -1;
    bool history = history_.enabled.load();
    if (history) (void)vmm_torch_native_lookup(ptr, &device, nullptr, &size);
    std::shared_ptr<c10::GatheredContext> context = history ? gather(cca::RecordContext::ALL) : nullptr;
    int status = vmm_torch_native_free(ptr, &device, why, sizeof why);
    if (history && status == kVmmOk && device >= 0) {
      std::lock_guard<std::mutex> hold(history_.lock);
      auto known = history_.contexts.find(ptr);
      if (known != history_.contexts.end()) {
        // PyTorch: the free's context, else the block's context_when_allocated (record_trace
        // keeps it where the history records ALLOC or more).
        if (!context && history_.when >= cca::RecordContext::ALLOC) context = known->second;
        history_.contexts.erase(known);
      }
      if (history_.freed.size() <= static_cast<size_t>(device)) history_.freed.resize(device + 1);
      history_.freed[device][reinterpret_cast<uintptr_t>(ptr)] = {++history_.freed_order, size};
      trace(TraceEntry::FREE_REQUESTED, device, reinterpret_cast<size_t>(ptr), size, nullptr, context);
      trace(TraceEntry::FREE_COMPLETED, device, reinterpret_cast<size_t>(ptr), size, nullptr, context);
    }
    return status;
  }

  // The context of this call when the history records `level` or more (no lock held: the
  // recorder takes the GIL).
  std::shared_ptr<c10::GatheredContext> gather(cca::RecordContext level) {
    if (!history_.enabled.load()) return nullptr;
    cca::CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> hold(history_.lock);
      if (history_.when < level) return nullptr;
      recorder = history_.recorder;
    }
    return recorder ? recorder() : nullptr;
  }

  // The mapping holding `ptr` when the arena made one during this request (its count of
  // mappings, cuMemCreate calls or cache releases moved since `before`), else {0, 0}.
  std::pair<uintptr_t, size_t> segment_created(int device, void* ptr, const vmm_torch_device_stats& before) {
    vmm_torch_device_stats after{};
    if (vmm_torch_native_stats(device, &after) != kVmmOk) return {0, 0};
    if (after.segment[0].current <= before.segment[0].current && after.num_device_alloc == before.num_device_alloc &&
        after.num_alloc_retries == before.num_alloc_retries)
      return {0, 0};
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (const auto& seg : segment_extents(device))
      if (seg.first <= p && p < seg.first + seg.second) return seg;
    return {0, 0};
  }

  // Appends an entry to the device's ring (caller holds history_.lock).
  void trace(TraceEntry::Action action, int device, size_t addr, size_t size, cudaStream_t stream,
             std::shared_ptr<c10::GatheredContext> context) {
    if (device < 0 || history_.skip[static_cast<size_t>(action)]) return;
    if (history_.traces.size() <= static_cast<size_t>(device)) {
      history_.traces.resize(device + 1);
      history_.next.resize(device + 1, 0);
    }
    auto& ring = history_.traces[device];
    TraceEntry entry(action, static_cast<c10::DeviceIndex>(device), addr, size, stream, MempoolId_t{0, 0},
                     c10::getApproximateTime(), std::move(context), "", history_.user_metadata);
    if (ring.size() < history_.max_entries) {
      ring.push_back(std::move(entry));
    } else {
      ring[history_.next[device]] = std::move(entry);
      history_.next[device] = (history_.next[device] + 1) % ring.size();
    }
  }

  // The segments and blocks of `device` (one pool, unless mempool_id is (0, 0)), by address,
  // the arrays grown until they hold them all; false (with `why`) where the shim refuses.
  bool fetch_segments(int device, MempoolId_t mempool_id, std::vector<vmm_torch_segment>* segs,
                      std::vector<vmm_torch_block>* blocks, char (&why)[kMessageCap]) {
    segs->resize(64);
    blocks->resize(256);
    for (int attempt = 0;; attempt++) {
      size_t n_seg = 0, n_block = 0;
      if (vmm_torch_native_segments(device, mempool_id.first, mempool_id.second, segs->data(), segs->size(), &n_seg,
                                    blocks->data(), blocks->size(), &n_block, why, sizeof why) != kVmmOk)
        return false;
      if (n_seg <= segs->size() && n_block <= blocks->size()) {
        segs->resize(n_seg);
        blocks->resize(n_block);
        return true;
      }
      if (attempt == 7) return true;  // still growing after 8 tries: the arrays as the last call filled them
      segs->resize(n_seg + 64);
      blocks->resize(n_block + 256);
    }
  }

  // The (address, extent) of each mapping of `device`, sorted by address.
  std::vector<std::pair<uintptr_t, size_t>> segment_extents(int device) {
    std::vector<vmm_torch_segment> segs;
    std::vector<vmm_torch_block> blocks;
    char why[kMessageCap];
    std::vector<std::pair<uintptr_t, size_t>> out;
    if (!fetch_segments(device, MempoolId_t{0, 0}, &segs, &blocks, why)) return out;
    for (const vmm_torch_segment& seg : segs) out.emplace_back(seg.address, seg.size);
    return out;
  }

  // A segment_free entry for each mapping of `before` that empty_cache gave back, with the
  // context of the call (PyTorch records one there where the history records everything).
  void trace_segments_freed(const std::vector<std::vector<std::pair<uintptr_t, size_t>>>& before,
                            std::shared_ptr<c10::GatheredContext> context) {
    for (size_t device = 0; device < before.size(); device++) {
      std::vector<std::pair<uintptr_t, size_t>> after = segment_extents(static_cast<int>(device));
      std::lock_guard<std::mutex> hold(history_.lock);
      for (const auto& seg : before[device])
        if (!std::binary_search(after.begin(), after.end(), seg))
          trace(TraceEntry::SEGMENT_FREE, static_cast<int>(device), seg.first, seg.second, nullptr, context);
    }
  }

  // Every refusal: PyTorch's out-of-memory message, then vmmarena's; the observers first.
  [[noreturn]] void out_of_memory(size_t size, c10::DeviceIndex device, cudaStream_t stream, int status,
                                  const char* why) {
    size_t device_free = 0, device_total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) (void)cudaGetLastError();
    }
    vmm_torch_device_stats s{};
    (void)vmm_torch_native_stats(device, &s);
    double fraction = 1.0;
    (void)vmm_torch_memory_fraction(device, &fraction, nullptr, 0);
    size_t allowed = fraction < 1.0 ? static_cast<size_t>(fraction * static_cast<double>(device_total)) : device_total;
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> hold(observers_lock_);
      observers = observers_;
    }
    for (const auto& observer : observers) observer(device, size, allowed, device_free);
    if (history_.enabled.load()) {
      std::lock_guard<std::mutex> hold(history_.lock);
      trace(TraceEntry::OOM, device, device_free, size, stream, nullptr);
    }
    const size_t allocated = static_cast<size_t>(s.allocated_bytes[0].current);
    const size_t reserved = static_cast<size_t>(s.reserved_bytes[0].current);
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated, reserved,
                                     c10::Device(c10::DeviceType::CUDA, device));
    std::string msg;
    if (status < 0) {
      msg = text("CUDA out of memory. Tried to allocate more than 1EB memory. vmmarena refused %zu bytes on device %d: "
                 "no device has that much memory", size, int(device));
    } else {
      msg = "CUDA out of memory. Tried to allocate " + size_text(size) + ". GPU " + std::to_string(int(device)) +
            " has a total capacity of " + size_text(device_total) + " of which " + size_text(device_free) + " is free. ";
      if (fraction < 1.0) msg += size_text(allowed) + " allowed; ";
      msg += "Of the allocated memory " + size_text(allocated) + " is allocated by PyTorch, and " +
             size_text(reserved > allocated ? reserved - allocated : 0) + " is reserved by PyTorch but unallocated. " +
             text("vmmarena refused %zu bytes on device %d (%s): ", size, int(device), status_name(status).c_str()) + why;
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }

  // The segments of `device` (of one pool, unless mempool_id is (0, 0)) for snapshot().
  void add_segments(int device, MempoolId_t mempool_id, std::vector<cca::SegmentInfo>* out) {
    std::vector<vmm_torch_segment> segs;
    std::vector<vmm_torch_block> blocks;
    char why[kMessageCap];
    TORCH_CHECK(fetch_segments(device, mempool_id, &segs, &blocks, why),
                text("vmmarena: snapshot of device %d: %s", device, why));
    const size_t n_seg = segs.size(), n_block = blocks.size();
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts;
    std::map<uintptr_t, std::pair<uint64_t, size_t>> freed;
    if (history_.enabled.load()) {
      std::lock_guard<std::mutex> hold(history_.lock);
      contexts = history_.contexts;
      if (static_cast<size_t>(device) < history_.freed.size()) freed = history_.freed[device];
    }
    for (size_t i = 0; i < n_seg && i < segs.size(); i++) {
      const vmm_torch_segment& seg = segs[i];
      cca::SegmentInfo info;
      info.device = static_cast<c10::DeviceIndex>(device);
      info.address = seg.address;
      info.total_size = seg.size;
      info.stream = seg.stream;
      info.is_large = !seg.is_page;
      info.is_expandable = false;
      info.owner_private_pool_id = {seg.pool_first, seg.pool_second};
      for (size_t b = seg.first_block; b < seg.first_block + seg.block_count && b < n_block; b++) {
        const vmm_torch_block& block = blocks[b];
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = block.size;
        bi.requested_size = block.requested;
        bi.allocated = block.state == 1;
        bi.active = block.state != 0;
        auto ctx = contexts.find(reinterpret_cast<void*>(block.address));
        if (block.state == 1 && ctx != contexts.end()) bi.context_when_allocated = ctx->second;
        if (block.state == 0) {  // free room: the request last freed into it, as PyTorch's inactive block
          uint64_t last = 0;
          for (auto f = freed.lower_bound(block.address); f != freed.end() && f->first < block.address + block.size; ++f)
            if (f->second.first > last) {
              last = f->second.first;
              bi.requested_size = f->second.second;
            }
        }
        if (bi.allocated) {
          info.allocated_size += block.size;
          info.requested_size += block.requested;
        }
        if (bi.active) info.active_size += block.size;
        info.blocks.push_back(std::move(bi));
      }
      out->push_back(std::move(info));
    }
  }

  bool initialized_ = false;
  bool enabled_ = true;
  int device_count_ = 0;
  std::mutex observers_lock_;
  std::vector<cca::OutOfMemoryObserver> observers_;
  std::vector<cca::AllocatorTraceTracker> trackers_;
  History history_;
  std::mutex ipc_lock_;                                            // CUDA IPC: guards ipc_open_
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_open_;  // handles opened here, by handle
};

Allocator* instance() {
  static Allocator* allocator = new Allocator();  // never destroyed: PyTorch holds it to the end
  return allocator;
}

void raw_delete_fn(void* ptr) {
  instance()->free_quietly(ptr);
}

// Makes vmmarena PyTorch's CUDA allocator: the pointer change_current_allocator swaps, and
// the device allocator registry (torch.accelerator.memory_*). `alloc_address` is the address
// of vmm_torch_native_alloc in the library the vmmarena package loaded: this module must be
// linked to that very copy, or its arenas would be another's.
void install(uint64_t alloc_address) {
  const auto ours = reinterpret_cast<uint64_t>(&vmm_torch_native_alloc);
  TORCH_CHECK(alloc_address == ours,
              text("vmmarena: the native allocator module is linked to another copy of libvmmarena_torch.so than the "
                   "one the vmmarena package loaded (vmm_torch_native_alloc at %p here, %p there); remove the cached "
                   "build (vmmarena._process.native_cache_dir()) and retry",
                   reinterpret_cast<void*>(ours), reinterpret_cast<void*>(alloc_address)));
  Allocator* allocator = instance();
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current == allocator) return;
  TORCH_CHECK(!current->initialized(), "vmmarena.install() must run before CUDA is initialized: PyTorch's allocator (" +
                                            current->name() + ") is in use already");
  cca::allocator.store(allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, allocator, /*priority=*/1);
}

bool installed() {
  return cca::allocator.load() == instance() && c10::GetAllocator(c10::DeviceType::CUDA) == instance();
}

}  // namespace
}  // namespace vmmarena

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vmmarena's native PyTorch CUDA allocator (vmmarena.install())";
  m.def("install", &vmmarena::install, "Makes vmmarena PyTorch's CUDA allocator (before CUDA is initialized)");
  m.def("installed", &vmmarena::installed, "Whether PyTorch's CUDA allocator is vmmarena's");
  m.attr("torch_version") = TORCH_VERSION;
}
