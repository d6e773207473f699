# Defines epd_core (alias epd::core) from this directory's sources. Included
# by src/core/CMakeLists.txt (the normal build) and src/gpu/standalone.cmake
# (the device machine's build); both provide Threads::Threads first. Paths
# are absolute because add_library resolves relative ones against the
# including directory, not this file's.
get_filename_component(_epd_core_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_core
  ${CMAKE_CURRENT_LIST_DIR}/status.cc
  ${CMAKE_CURRENT_LIST_DIR}/admission_filter.cc
  ${CMAKE_CURRENT_LIST_DIR}/policy_duel.cc
  ${CMAKE_CURRENT_LIST_DIR}/content_key_type.cc
  ${CMAKE_CURRENT_LIST_DIR}/embedding.cc
  ${CMAKE_CURRENT_LIST_DIR}/encode_scheduler.cc
  ${CMAKE_CURRENT_LIST_DIR}/encode_types.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_scheduler.cc
  ${CMAKE_CURRENT_LIST_DIR}/tenant_quota.cc
)
add_library(epd::core ALIAS epd_core)
target_include_directories(epd_core PUBLIC
  $<BUILD_INTERFACE:${_epd_core_root}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_core PUBLIC Threads::Threads)
# The public headers are C++20 (std::span, defaulted comparisons), so every
# user of epd::core, installed ones included, compiles as C++20 at least.
target_compile_features(epd_core PUBLIC cxx_std_20)
