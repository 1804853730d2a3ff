// Compile-time check that the shim's entry points fit PyTorch's pluggable allocator
// (torch/csrc/cuda/CUDAPluggableAllocator.h). Compiled, never run, where the torch headers
// are found (tests/gpu/run); a mismatch is a compile error.
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <functional>
#include <type_traits>

#include "vmmarena_torch.h"
#include "vmmarena_torch_process.h"

namespace {

// The std::function types CUDAPluggableAllocator stores and createCustomAllocator takes.
using AllocFn = std::function<void*(size_t, int, cudaStream_t)>;
using FreeFn = std::function<void(void*, size_t, int, cudaStream_t)>;

static_assert(std::is_same_v<cudaStream_t, CUstream>, "cudaStream_t is not the driver's CUstream");
static_assert(sizeof(ssize_t) == sizeof(size_t) && alignof(ssize_t) == alignof(size_t),
              "the shim's ssize_t size argument is not passed like PyTorch's size_t");
static_assert(std::is_same_v<decltype(&torch::cuda::CUDAPluggableAllocator::createCustomAllocator),
                             std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> (*)(AllocFn, FreeFn)>,
              "createCustomAllocator no longer takes exactly these function types");

// torch._C._cuda_customAllocator casts the symbols ctypes found to these pointer types.
static_assert(std::is_same_v<decltype(&vmm_torch_package_allocate), void* (*)(ssize_t, int, CUstream)>);
static_assert(std::is_same_v<decltype(&vmm_torch_transient_allocate), void* (*)(ssize_t, int, CUstream)>);
static_assert(std::is_same_v<decltype(&vmm_torch_free), void (*)(void*, ssize_t, int, CUstream)>);

[[maybe_unused]] const AllocFn package_allocate = vmm_torch_package_allocate;
[[maybe_unused]] const AllocFn transient_allocate = vmm_torch_transient_allocate;
[[maybe_unused]] const FreeFn release = vmm_torch_free;

// ---- Whole-process mode: the hooks vmmarena.install() hands the pluggable allocator ----
using Allocator = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
// The function types the _CUDAPluggableAllocator setters cast an address to.
using ResetFn = void();
using MemoryFractionFn = void(double, int);
using RecordStreamFn = void(void*, cudaStream_t);
using BeginPoolFn = void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>);
using PoolFn = void(int, c10::cuda::MempoolId_t);

static_assert(std::is_same_v<vmm_torch_mempool_id, c10::cuda::MempoolId_t>, "MempoolId_t is no longer this pair");
static_assert(std::is_same_v<vmm_torch_stream_filter, std::function<bool(cudaStream_t)>>);

// Each setter still takes a std::function of that type.
static_assert(std::is_same_v<decltype(&Allocator::set_reset_fn), void (Allocator::*)(std::function<ResetFn>)>);
static_assert(std::is_same_v<decltype(&Allocator::set_memory_fraction_fn),
                             void (Allocator::*)(std::function<MemoryFractionFn>)>);
static_assert(std::is_same_v<decltype(&Allocator::set_record_stream_fn),
                             void (Allocator::*)(std::function<RecordStreamFn>)>);
static_assert(std::is_same_v<decltype(&Allocator::set_begin_allocate_to_pool),
                             void (Allocator::*)(std::function<BeginPoolFn>)>);
static_assert(std::is_same_v<decltype(&Allocator::set_end_allocate_to_pool_fn), void (Allocator::*)(std::function<PoolFn>)>);
static_assert(std::is_same_v<decltype(&Allocator::set_release_pool), void (Allocator::*)(std::function<PoolFn>)>);

// And the shim's hooks have exactly those types.
static_assert(std::is_same_v<decltype(&vmm_torch_process_malloc), void* (*)(size_t, int, CUstream)>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_empty_cache), ResetFn*>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_memory_fraction), MemoryFractionFn*>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_record_stream), RecordStreamFn*>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_begin_pool), BeginPoolFn*>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_end_pool), PoolFn*>);
static_assert(std::is_same_v<decltype(&vmm_torch_process_release_pool), PoolFn*>);

[[maybe_unused]] const AllocFn process_allocate = vmm_torch_process_malloc;

}  // namespace
