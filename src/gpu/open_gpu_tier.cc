// OpenGpuTier: the CUDA device of a GPU tier, sized by SizeGpuTier. Kept out
// of cuda_device.cu so the rule's callers need no CUDA header and the rule
// itself (in epd::gpu) is tested without a GPU.
#include "epd/gpu/device_tier.h"
#include "epd/gpu_cuda/cuda_device.h"

namespace epd {

StatusOr<std::unique_ptr<Device>> OpenGpuTier(int device_index, std::size_t l1_bytes, std::size_t l2_bytes) {
  const GpuTierSizing sizing = SizeGpuTier(l1_bytes, l2_bytes);
  CudaDeviceOptions options;
  options.device_index = device_index;
  options.pinned_pool_bytes = sizing.pinned_pool_bytes;
  options.device_bytes_limit = sizing.device_bytes_limit;
  return OpenCudaDevice(options);
}

}  // namespace epd
