# Defines epd_media (alias epd::media) from this directory's sources. Shared
# by src/media/CMakeLists.txt (the normal build) and src/gpu/standalone.cmake
# (the device machine's build), which each provide the dependencies first:
# imported targets OpenSSL::Crypto, PNG::PNG, PkgConfig::TURBOJPEG,
# PkgConfig::XXHASH, PkgConfig::WEBP (libwebp + libwebpdemux) and
# PkgConfig::GIF (giflib). (STB_INCLUDE_DIR is no longer read: the resampler
# is our own, resample.cc.)
#
# Edge dependencies (libcrypto, libxxhash, libturbojpeg, libpng, libwebp,
# giflib) stay PRIVATE: the public headers mention none of them. Paths
# are absolute because add_library resolves relative ones against the
# including directory, not this file's.
add_library(epd_media
  ${CMAKE_CURRENT_LIST_DIR}/content_key.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_bmp.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_gif.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_jpeg.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_png.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_webp.cc
  ${CMAKE_CURRENT_LIST_DIR}/digest.cc
  ${CMAKE_CURRENT_LIST_DIR}/exif.cc
  ${CMAKE_CURRENT_LIST_DIR}/image.cc
  ${CMAKE_CURRENT_LIST_DIR}/patch_writer.cc
  ${CMAKE_CURRENT_LIST_DIR}/preprocess.cc
  ${CMAKE_CURRENT_LIST_DIR}/resample.cc
  ${CMAKE_CURRENT_LIST_DIR}/tenant_key.cc
  ${CMAKE_CURRENT_LIST_DIR}/video_sampling.cc
)
add_library(epd::media ALIAS epd_media)
# The resampler's weights must round as Pillow's do (resample.cc): no fused
# multiply-add may change an IEEE double operation.
target_compile_options(epd_media PRIVATE -ffp-contract=off)
target_link_libraries(epd_media
  PUBLIC epd::core
  PRIVATE OpenSSL::Crypto PNG::PNG PkgConfig::TURBOJPEG PkgConfig::XXHASH PkgConfig::WEBP PkgConfig::GIF)
