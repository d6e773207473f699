# Defines epd_video (alias epd::video), the FFmpeg container decoder, from
# this directory's sources. The including build provides the imported target
# PkgConfig::FFMPEG (libavformat, libavcodec, libswscale, libavutil) and
# epd::media first. FFmpeg stays PRIVATE: epd/video/video_decoder.h mentions none
# of its types, so nothing above this edge includes an FFmpeg header.
add_library(epd_video
  ${CMAKE_CURRENT_LIST_DIR}/decode_budget.cc
  ${CMAKE_CURRENT_LIST_DIR}/ffmpeg_log.cc
  ${CMAKE_CURRENT_LIST_DIR}/video_decoder.cc
  ${CMAKE_CURRENT_LIST_DIR}/video_orientation.cc
)
add_library(epd::video ALIAS epd_video)
target_link_libraries(epd_video PUBLIC epd::media PRIVATE PkgConfig::FFMPEG)
