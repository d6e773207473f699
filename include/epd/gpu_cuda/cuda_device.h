// epd/gpu_cuda/cuda_device.h: the Device (epd/gpu/device.h) of one CUDA GPU.
//
// Only built with -DEPD_WITH_CUDA=ON (library epd::gpu_cuda); no CUDA header
// appears here, so code that includes it compiles without the toolkit.
//
// What OpenCudaDevice sets up:
//   - two streams created with cudaStreamNonBlocking, so neither waits for
//     the legacy default stream (where the tower may run): kOnboard (H2D) and
//     kOffload (D2H);
//   - one pinned arena of pinned_pool_bytes (cudaHostAlloc, portable), carved
//     by HostMemoryPool: the L2 tier. Size it as the L2 capacity
//     (`--host-cache-mb`) plus headroom for the largest entry (docs/GPU.md);
//   - device memory from the stream-ordered allocator (cudaMallocAsync /
//     cudaFreeAsync on the onboard stream, release threshold raised so freed
//     blocks are reused rather than returned to the driver), because cudaFree
//     synchronises the whole device and would stall the tower. Falls back to
//     cudaMalloc/cudaFree on a device without memory pools.
//   - events created with cudaEventDisableTiming (cheapest to record/query).
//
// Errors (OpenCudaDevice):
//   kFailedPrecondition  no CUDA driver or device, or device_index out of range
//   kResourceExhausted   the pinned arena could not be allocated
//   kInternal            any other CUDA failure (message from cudaGetErrorString)
//
// Thread safety: thread-safe (the CUDA runtime is; the pool and the release
// list lock). Lifetime: as every Device.
//
// Example:
//   auto dev = epd::OpenGpuTier(/*device_index=*/0, l1_bytes, l2_bytes);  // sized by SizeGpuTier
//   if (!dev.ok()) return dev.status();
//   epd::TieredEmbeddingCache<epd::ContentKey, epd::TierEmbeddingPtr, epd::ContentKeyHash> cache(
//       l1_bytes, l2_bytes, epd::MakeOffloadFn(**dev), epd::MakeOnboardFn(**dev));
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "epd/core/status.h"
#include "epd/gpu/device.h"

namespace epd {

struct CudaDeviceOptions {
  // Ordinal as cudaSetDevice takes it. Default 0.
  int device_index = 0;
  // Size of the pinned L2 arena. 0: no pinned memory (every demotion drops).
  std::size_t pinned_pool_bytes = 0;
  // Cap on device memory handed out by Allocate; 0: only the card's free
  // memory bounds it. Set it to the L1 capacity plus in-flight headroom so
  // the tier never competes with the tower's activations.
  std::size_t device_bytes_limit = 0;
};

// Number of CUDA devices; kFailedPrecondition naming the CUDA error when the
// runtime cannot reach a driver (e.g. "CUDA driver version is insufficient").
StatusOr<int> CudaDeviceCount();

// Opens device `options.device_index`; see the header comment.
StatusOr<std::unique_ptr<Device>> OpenCudaDevice(const CudaDeviceOptions& options);

// Opens CUDA device `device_index` for a GPU tier of `l1_bytes` (VRAM) over
// `l2_bytes` (pinned host memory), sized by SizeGpuTier (epd/gpu/device_tier.h).
// The one way the CLI (`--device cuda`) and the GPU benchmarks open the
// tier's device. Errors as OpenCudaDevice.
StatusOr<std::unique_ptr<Device>> OpenGpuTier(int device_index, std::size_t l1_bytes, std::size_t l2_bytes);

}  // namespace epd
