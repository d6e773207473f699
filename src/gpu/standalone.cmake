# Standalone build of src/gpu for scripts/gpu-check.sh: epd::core, GoogleTest,
# CUDA and, optionally, the torch tower and epd::media + epd::safetensors +
# epd::worker + epd::model (+ epd::checkpoint_tower and checkpoint_tower_bench with the
# torch tower), each from its own library.cmake, and nothing else (no gRPC or Python); then
# src/gpu/CMakeLists.txt adds the tier and bench/gpu.
#
#   cmake -S src/gpu -B build-gpucheck -G Ninja \
#     [-DEPD_GTEST_SOURCE_DIR=<googletest source>]   when GTest is not installed
#     [-DEPD_GPU_WITH_TORCH=ON -DCMAKE_PREFIX_PATH=<torch cmake prefix>]
#     [-DEPD_GPU_WITH_WORKER=ON -DEPD_GPU_SYSROOT=<staged sysroot>]
#
# The device machine's image has no Debian -dev packages, so the media
# libraries' headers and static archives come from a sysroot that
# `scripts/gpu-check.sh --stage` unpacks from Debian 12 packages
# (build-gpucarry/sysroot). Only that sysroot is searched for them, never
# /usr, so every device build links the same archives.
get_filename_component(EPD_ROOT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)

option(EPD_WITH_CUDA "Build the CUDA device tier" ON)
option(EPD_GPU_WITH_TORCH "Build the tower benchmark against libtorch" OFF)
option(EPD_GPU_WITH_WORKER "Also build epd::media and epd::worker against EPD_GPU_SYSROOT" OFF)
set(EPD_GTEST_SOURCE_DIR "" CACHE PATH "GoogleTest source tree, used when find_package(GTest) fails")
set(EPD_GPU_SYSROOT "" CACHE PATH
    "Unpacked Debian 12 -dev packages (usr/include, usr/lib/x86_64-linux-gnu/*.a) for EPD_GPU_WITH_WORKER")

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "" FORCE)
endif()
add_compile_options(-Wall -Wextra)
if(EPD_WITH_CUDA)
  include(${CMAKE_CURRENT_LIST_DIR}/enable_cuda.cmake)
endif()

enable_testing()
find_package(Threads REQUIRED)
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  if(NOT EPD_GTEST_SOURCE_DIR)
    message(FATAL_ERROR "GoogleTest not found: install it, or pass -DEPD_GTEST_SOURCE_DIR=<googletest "
                        "source> (scripts/gpu-check.sh --stage copies Debian's /usr/src/googletest)")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(${EPD_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  foreach(lib gtest gmock gtest_main)
    if(NOT TARGET GTest::${lib})
      add_library(GTest::${lib} ALIAS ${lib})
    endif()
  endforeach()
endif()
include(${EPD_ROOT}/cmake/epd_add_test.cmake)

# The libraries below the tier (and, optionally, beside and above it) from
# the same library.cmake files the top-level build includes.
include(GNUInstallDirs)
include(${EPD_ROOT}/src/core/library.cmake)

if(EPD_GPU_WITH_TORCH)
  find_package(Torch REQUIRED)
  include(${EPD_ROOT}/src/tower/library.cmake)
endif()

if(NOT EPD_GPU_WITH_WORKER)
  return()
endif()

# --- epd::media and epd::worker against the staged sysroot -------------------
# Imported targets named as find_package/pkg_check_modules name them, so
# src/media/library.cmake and src/worker/library.cmake link them unchanged.
# Debian's static archives are built as PIE (its GCC's default), so they link
# into this build's PIE executables; they need only glibc, libm and, for
# libcrypto, threads and libdl.
if(NOT EPD_GPU_SYSROOT)
  message(FATAL_ERROR "EPD_GPU_WITH_WORKER=ON needs -DEPD_GPU_SYSROOT=<dir> "
                      "(scripts/gpu-check.sh --stage unpacks one into build-gpucarry/sysroot)")
endif()
set(_epd_sysroot_inc ${EPD_GPU_SYSROOT}/usr/include)
set(_epd_sysroot_lib ${EPD_GPU_SYSROOT}/usr/lib/x86_64-linux-gnu)

# Checks that each path exists under the sysroot, naming the first missing one.
function(_epd_sysroot_require)
  foreach(path ${ARGN})
    if(NOT EXISTS ${path})
      message(FATAL_ERROR "EPD_GPU_SYSROOT: ${path} is missing; rerun scripts/gpu-check.sh --stage")
    endif()
  endforeach()
endfunction()

# Adds a STATIC IMPORTED target for an archive, unless the target exists.
#   _epd_sysroot_static(TARGET LIB <archive> INCLUDES <dirs> LINKS <libs>)
function(_epd_sysroot_static)
  cmake_parse_arguments(A "" "TARGET;LIB" "INCLUDES;LINKS" ${ARGN})
  if(TARGET ${A_TARGET})
    return()
  endif()
  _epd_sysroot_require(${A_LIB} ${A_INCLUDES})
  add_library(${A_TARGET} STATIC IMPORTED GLOBAL)
  set_target_properties(${A_TARGET} PROPERTIES
    IMPORTED_LOCATION ${A_LIB}
    INTERFACE_INCLUDE_DIRECTORIES "${A_INCLUDES}"
    INTERFACE_LINK_LIBRARIES "${A_LINKS}")
endfunction()

_epd_sysroot_static(TARGET ZLIB::ZLIB LIB ${_epd_sysroot_lib}/libz.a
                    INCLUDES ${_epd_sysroot_inc})
_epd_sysroot_static(TARGET PNG::PNG LIB ${_epd_sysroot_lib}/libpng16.a
                    INCLUDES ${_epd_sysroot_inc}/libpng16 LINKS ZLIB::ZLIB m)
# OpenSSL's configuration.h lives in the multiarch include directory.
_epd_sysroot_static(TARGET OpenSSL::Crypto LIB ${_epd_sysroot_lib}/libcrypto.a
                    INCLUDES ${_epd_sysroot_inc} ${_epd_sysroot_inc}/x86_64-linux-gnu
                    LINKS Threads::Threads ${CMAKE_DL_LIBS})
_epd_sysroot_static(TARGET PkgConfig::TURBOJPEG LIB ${_epd_sysroot_lib}/libturbojpeg.a
                    INCLUDES ${_epd_sysroot_inc})
_epd_sysroot_static(TARGET PkgConfig::XXHASH LIB ${_epd_sysroot_lib}/libxxhash.a
                    INCLUDES ${_epd_sysroot_inc})
_epd_sysroot_static(TARGET epd_sysroot_webp LIB ${_epd_sysroot_lib}/libwebp.a
                    INCLUDES ${_epd_sysroot_inc} LINKS Threads::Threads m)
_epd_sysroot_static(TARGET PkgConfig::WEBP LIB ${_epd_sysroot_lib}/libwebpdemux.a
                    INCLUDES ${_epd_sysroot_inc} LINKS epd_sysroot_webp)
_epd_sysroot_static(TARGET PkgConfig::GIF LIB ${_epd_sysroot_lib}/libgif.a
                    INCLUDES ${_epd_sysroot_inc})
if(NOT TARGET nlohmann_json::nlohmann_json)
  _epd_sysroot_require(${_epd_sysroot_inc}/nlohmann/json.hpp)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${_epd_sysroot_inc})
endif()
_epd_sysroot_require(${_epd_sysroot_inc}/stb/stb_image_resize.h)
set(STB_INCLUDE_DIR ${_epd_sysroot_inc})

include(${EPD_ROOT}/src/media/library.cmake)
include(${EPD_ROOT}/src/safetensors/library.cmake)
include(${EPD_ROOT}/src/worker/library.cmake)

# --- epd::model, epd::checkpoint_tower and checkpoint_tower_bench -------------
# The real checkpoint loader (header-only nlohmann-json from the sysroot, and
# epd::media above) and, with the torch tower, the checkpoint towers and their
# benchmark (docs/GPU.md "Real-size checkpoint tower"), built into bench-gpu/
# beside the other GPU benchmarks.
include(${EPD_ROOT}/src/model/library.cmake)
if(EPD_GPU_WITH_TORCH)
  include(${EPD_ROOT}/src/tower/checkpoint_library.cmake)
  add_executable(checkpoint_tower_bench ${EPD_ROOT}/src/tower/checkpoint_tower_bench.cc)
  target_link_libraries(checkpoint_tower_bench PRIVATE epd::checkpoint_tower nlohmann_json::nlohmann_json)
  set_target_properties(checkpoint_tower_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench-gpu)
endif()
