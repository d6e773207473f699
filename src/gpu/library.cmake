# Defines epd_gpu (alias epd::gpu: Device, HostMemoryPool,
# TierEmbedding, the tier copies and their sizing rule; no CUDA), the
# test-only epd_fake_device (FakeDevice, from src/testing/) and, with
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
  ${CMAKE_CURRENT_LIST_DIR}/host_memory_pool.cc
)
add_library(epd::gpu ALIAS epd_gpu)
target_link_libraries(epd_gpu PUBLIC epd::core)

# FakeDevice, the test double of Device (src/testing/fake_device.h): host
# memory standing in for VRAM, with injectable failures and IPC across
# processes. For tests and checks only; not installed.
get_filename_component(_epd_testing_src ${CMAKE_CURRENT_LIST_DIR}/../testing ABSOLUTE)
add_library(epd_fake_device STATIC ${_epd_testing_src}/fake_device.cc ${_epd_testing_src}/fake_device_ipc.cc)
target_include_directories(epd_fake_device PUBLIC ${_epd_testing_src})
target_link_libraries(epd_fake_device PUBLIC epd::gpu)

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
