# Defines epd_http (alias epd::http) from this directory's sources. The
# caller provides epd::core, Boost::headers, CURL::libcurl, OpenSSL and
# Threads first (src/http/CMakeLists.txt). Paths are absolute because
# add_library resolves relative ones against the including directory.
get_filename_component(_epd_http_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_http
  ${CMAKE_CURRENT_LIST_DIR}/address_policy.cc
  ${CMAKE_CURRENT_LIST_DIR}/http_endpoint.cc
  ${CMAKE_CURRENT_LIST_DIR}/http_session.cc
  ${CMAKE_CURRENT_LIST_DIR}/media_fetch.cc
  ${CMAKE_CURRENT_LIST_DIR}/tls_context.cc)
add_library(epd::http ALIAS epd_http)
target_include_directories(epd_http PUBLIC
  $<BUILD_INTERFACE:${_epd_http_root}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_http
  PUBLIC epd::core
  PRIVATE Boost::headers CURL::libcurl OpenSSL::SSL OpenSSL::Crypto Threads::Threads)

