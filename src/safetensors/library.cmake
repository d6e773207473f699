# Defines epd_safetensors (alias epd::safetensors): the safetensors codec
# (epd/safetensors/safetensors_codec.h) that epd::model's checkpoint reader
# and epd::worker's embedding files share. Included by
# src/safetensors/CMakeLists.txt (the normal build) and
# src/gpu/standalone.cmake (the device machine's build), which each provide
# epd::core and the imported target nlohmann_json::nlohmann_json
# (header-only) first. nlohmann-json stays PRIVATE: the public header
# mentions none of it. Paths are absolute because add_library resolves
# relative ones against the including directory, not this file's.
get_filename_component(_epd_safetensors_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_safetensors ${CMAKE_CURRENT_LIST_DIR}/safetensors_codec.cc)
add_library(epd::safetensors ALIAS epd_safetensors)
target_include_directories(epd_safetensors PUBLIC $<BUILD_INTERFACE:${_epd_safetensors_root}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_safetensors PUBLIC epd::core PRIVATE nlohmann_json::nlohmann_json)
