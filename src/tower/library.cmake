# Defines epd_torch_tower (alias epd::torch_tower) from torch_tower.cc.
# Included by src/tower/CMakeLists.txt (the normal build) and
# src/gpu/standalone.cmake (the device machine's build), which each provide
# epd::core and TORCH_LIBRARIES (find_package(Torch)) first. Torch stays
# PRIVATE: epd/torch_tower/torch_tower.h mentions none of it. Paths are absolute because
# add_library resolves relative ones against the including directory, not
# this file's.
get_filename_component(_epd_tower_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_torch_tower ${CMAKE_CURRENT_LIST_DIR}/torch_tower.cc)
add_library(epd::torch_tower ALIAS epd_torch_tower)
target_include_directories(epd_torch_tower PUBLIC
  $<BUILD_INTERFACE:${_epd_tower_root}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_torch_tower PUBLIC epd::core PRIVATE ${TORCH_LIBRARIES})
