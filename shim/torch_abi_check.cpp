// Compile-time check that the shim's entry points fit PyTorch's pluggable allocator
// (torch/csrc/cuda/CUDAPluggableAllocator.h). Compiled, never run, where the torch headers
// are found (tests/gpu/run); a mismatch is a compile error.
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <functional>
#include <type_traits>

#include "vmmarena_torch.h"

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

}  // namespace
