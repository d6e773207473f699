# Defines epd_openai (alias epd::openai) from this directory's sources. The
# caller provides epd::server, epd::http, epd::safetensors, epd::worker,
# nlohmann_json, simdjson, prometheus-cpp, CURL and OpenSSL first
# (src/openai/CMakeLists.txt). Paths are absolute because add_library
# resolves relative ones against the including directory.
get_filename_component(_epd_openai_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_openai
  ${CMAKE_CURRENT_LIST_DIR}/chat_reply.cc
  ${CMAKE_CURRENT_LIST_DIR}/chat_request.cc
  ${CMAKE_CURRENT_LIST_DIR}/ec_files.cc
  ${CMAKE_CURRENT_LIST_DIR}/ec_publisher.cc
  ${CMAKE_CURRENT_LIST_DIR}/fetch_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/front_metrics.cc
  ${CMAKE_CURRENT_LIST_DIR}/kwargs_check.cc
  ${CMAKE_CURRENT_LIST_DIR}/media_source.cc
  ${CMAKE_CURRENT_LIST_DIR}/probe_reply.cc
  ${CMAKE_CURRENT_LIST_DIR}/openai_front.cc)
add_library(epd::openai ALIAS epd_openai)
target_include_directories(epd_openai PUBLIC
  $<BUILD_INTERFACE:${_epd_openai_root}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_openai
  PUBLIC epd::server epd::http epd::safetensors epd::worker
  PRIVATE nlohmann_json::nlohmann_json simdjson::simdjson prometheus-cpp::core CURL::libcurl OpenSSL::Crypto)

