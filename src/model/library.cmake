# Defines epd_model (alias epd::model) from safetensors_file.cc,
# checkpoint_config.cc and checkpoint.cc. Shared by src/model/CMakeLists.txt (the normal build) and
# src/gpu/standalone.cmake (the device machine's build), which each provide
# epd::core, epd::media, epd::safetensors (the format, which the public
# safetensors_file.h includes) and the imported target
# nlohmann_json::nlohmann_json (header-only) first. nlohmann-json stays PRIVATE: the public headers
# mention none of it. src/media is a private include directory for media's
# internal SHA-256 (digest.h), which the model id uses. Paths are absolute
# because add_library resolves relative ones against the including
# directory, not this file's.
get_filename_component(_epd_model_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_model ${CMAKE_CURRENT_LIST_DIR}/safetensors_file.cc ${CMAKE_CURRENT_LIST_DIR}/checkpoint_config.cc
            ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cc)
add_library(epd::model ALIAS epd_model)
target_include_directories(epd_model PUBLIC $<BUILD_INTERFACE:${_epd_model_root}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                           PRIVATE ${_epd_model_root}/src/media)
target_link_libraries(epd_model PUBLIC epd::core epd::media epd::safetensors PRIVATE nlohmann_json::nlohmann_json)
