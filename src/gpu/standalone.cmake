# Standalone build of src/gpu for scripts/gpu-check.sh: epd::core's sources,
# GoogleTest, CUDA and, optionally, the torch tower, and nothing else (no
# media libraries, gRPC or Python).
#
#   cmake -S src/gpu -B build-gpucheck -G Ninja \
#     [-DEPD_GTEST_SOURCE_DIR=<googletest source>]   when GTest is not installed
#     [-DEPD_GPU_WITH_TORCH=ON -DCMAKE_PREFIX_PATH=<torch cmake prefix>]
get_filename_component(EPD_ROOT ${CMAKE_CURRENT_SOURCE_DIR}/../.. ABSOLUTE)

option(EPD_WITH_CUDA "Build the CUDA device tier" ON)
option(EPD_GPU_WITH_TORCH "Build the tower benchmark against libtorch" OFF)
set(EPD_GTEST_SOURCE_DIR "" CACHE PATH "GoogleTest source tree, used when find_package(GTest) fails")

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
include(GoogleTest)

# As the top-level helper.
function(epd_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60)
endfunction()

# The part of epd::core the tier uses (status, embedding); the rest is
# header-only templates.
add_library(epd_core ${EPD_ROOT}/src/core/status.cc ${EPD_ROOT}/src/core/embedding.cc)
add_library(epd::core ALIAS epd_core)
target_include_directories(epd_core PUBLIC ${EPD_ROOT}/include)
target_link_libraries(epd_core PUBLIC Threads::Threads)

if(EPD_GPU_WITH_TORCH)
  find_package(Torch REQUIRED)
  add_library(epd_torch_tower ${EPD_ROOT}/src/tower/torch_tower.cc)
  add_library(epd::torch_tower ALIAS epd_torch_tower)
  target_link_libraries(epd_torch_tower PUBLIC epd::core PRIVATE ${TORCH_LIBRARIES})
endif()
