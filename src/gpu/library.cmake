# Defines epd_gpu (alias epd::gpu: Device, FakeDevice, HostMemoryPool,
# TierEmbedding, the tier copies and their sizing rule; no CUDA) and, with
# EPD_WITH_CUDA, epd_gpu_cuda (alias epd::gpu_cuda: the CUDA Device and
# OpenGpuTier; CUDA headers stay in cuda_device.cu). Included by
# src/gpu/CMakeLists.txt, which serves both the top-level build and the
# standalone one (standalone.cmake); both provide epd::core first, and
# CUDA::cudart (enable_cuda.cmake) when EPD_WITH_CUDA is on. Paths are
# absolute because add_library resolves relative ones against the including
# directory, not this file's.
add_library(epd_gpu
  ${CMAKE_CURRENT_LIST_DIR}/device.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_tier.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device.cc
  ${CMAKE_CURRENT_LIST_DIR}/fake_device_ipc.cc
  ${CMAKE_CURRENT_LIST_DIR}/host_memory_pool.cc
)
add_library(epd::gpu ALIAS epd_gpu)
target_link_libraries(epd_gpu PUBLIC epd::core)

if(EPD_WITH_CUDA)
  add_library(epd_gpu_cuda
    ${CMAKE_CURRENT_LIST_DIR}/cuda_device.cu
    ${CMAKE_CURRENT_LIST_DIR}/open_gpu_tier.cc)
  add_library(epd::gpu_cuda ALIAS epd_gpu_cuda)
  target_link_libraries(epd_gpu_cuda PUBLIC epd::gpu PRIVATE CUDA::cudart)
  # enable_cuda.cmake passes -std=c++20 itself; without this the project-wide
  # CXX_STANDARD_REQUIRED carries over to CUDA, which CMake 3.25 cannot satisfy
  # for nvcc 13 (it does not know the flag) and so refuses to generate.
  set_target_properties(epd_gpu_cuda PROPERTIES CUDA_STANDARD_REQUIRED OFF)
endif()
