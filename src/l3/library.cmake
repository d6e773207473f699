# Defines epd_l3 (alias epd::l3): the shared tier (L3) on Redis. The caller
# provides epd::core, epd::media, PkgConfig::HIREDIS, PkgConfig::L3_XXHASH and
# OpenSSL::Crypto first. hiredis, xxhash and OpenSSL stay PRIVATE: the public
# headers mention none of them (epd/l3/l3_mac.h forward-declares OpenSSL's
# context types).
get_filename_component(_epd_l3_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
add_library(epd_l3
  ${CMAKE_CURRENT_LIST_DIR}/l3_keyring.cc
  ${CMAKE_CURRENT_LIST_DIR}/l3_lease.cc
  ${CMAKE_CURRENT_LIST_DIR}/l3_mac.cc
  ${CMAKE_CURRENT_LIST_DIR}/l3_ring.cc
  ${CMAKE_CURRENT_LIST_DIR}/l3_value.cc
  ${CMAKE_CURRENT_LIST_DIR}/redis_cluster.cc
  ${CMAKE_CURRENT_LIST_DIR}/redis_router.cc
  ${CMAKE_CURRENT_LIST_DIR}/redis_shard.cc
  ${CMAKE_CURRENT_LIST_DIR}/redis_tier.cc
)
add_library(epd::l3 ALIAS epd_l3)
target_include_directories(epd_l3 PUBLIC
  $<BUILD_INTERFACE:${_epd_l3_root}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(epd_l3
  PUBLIC epd::core epd::media
  PRIVATE PkgConfig::HIREDIS PkgConfig::L3_XXHASH OpenSSL::Crypto)
