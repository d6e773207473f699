# Defines epd_worker (alias epd::worker) from this directory's sources.
# Shared by src/worker/CMakeLists.txt (the normal build) and
# src/gpu/standalone.cmake (the device machine's build), which each provide
# epd::core, epd::media, epd::safetensors (the codec of safetensors.cc,
# private: the public headers mention none of it) and Threads::Threads
# first. Paths are absolute because add_library resolves relative ones
# against the including directory, not this file's.
get_filename_component(_epd_worker_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_worker
  ${CMAKE_CURRENT_LIST_DIR}/adopt_check.cc
  ${CMAKE_CURRENT_LIST_DIR}/batch_output.cc
  ${CMAKE_CURRENT_LIST_DIR}/encode_worker.cc
  ${CMAKE_CURRENT_LIST_DIR}/item_probe.cc
  ${CMAKE_CURRENT_LIST_DIR}/item_rules.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_queue.cc
  ${CMAKE_CURRENT_LIST_DIR}/job_table.cc
  ${CMAKE_CURRENT_LIST_DIR}/loop_command.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefetch_decoder.cc
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cc
  ${CMAKE_CURRENT_LIST_DIR}/shared_tier_lookup.cc
  ${CMAKE_CURRENT_LIST_DIR}/tenant_task_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/tower_runner.cc
  ${CMAKE_CURRENT_LIST_DIR}/video_items.cc
  ${CMAKE_CURRENT_LIST_DIR}/video_serving.cc
  ${CMAKE_CURRENT_LIST_DIR}/worker_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/worker_loop.cc
  ${CMAKE_CURRENT_LIST_DIR}/worker_options.cc
)
add_library(epd::worker ALIAS epd_worker)
target_include_directories(epd_worker PUBLIC
  $<BUILD_INTERFACE:${_epd_worker_root}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_worker
  PUBLIC epd::core epd::media Threads::Threads
  PRIVATE epd::safetensors)
