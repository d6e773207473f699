# Turns on the CUDA language for -DEPD_WITH_CUDA=ON. Included by the top-level
# CMakeLists.txt and by src/gpu's standalone build (scripts/gpu-check.sh).
#
# - nvcc is looked for on PATH, then at /usr/local/cuda/bin/nvcc (where the
#   toolkit installs it); CUDACXX or -DCMAKE_CUDA_COMPILER override both.
# - sm_90 (Hopper: H100/H200) unless CMAKE_CUDA_ARCHITECTURES is given.
# - C++20: CMake 3.25 does not know that nvcc 13 supports C++20. With
#   CMAKE_CUDA_STANDARD 20 it silently decays to an older standard, and with
#   CMAKE_CUDA_STANDARD_REQUIRED it refuses to configure; hence the standard
#   without REQUIRED plus an explicit -std=c++20.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(EPD_NVCC nvcc PATHS /usr/local/cuda/bin NO_CACHE)
  if(EPD_NVCC)
    set(CMAKE_CUDA_COMPILER ${EPD_NVCC})
  endif()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
set(CMAKE_CUDA_STANDARD 20)
if(NOT CMAKE_CUDA_FLAGS MATCHES "-std=c\\+\\+20")
  string(APPEND CMAKE_CUDA_FLAGS " -std=c++20")
endif()
# One runtime for .cu objects and C++ code that calls CUDA::cudart.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
