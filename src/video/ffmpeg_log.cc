// See ffmpeg_log.h.
#include "ffmpeg_log.h"

extern "C" {
#include <libavutil/error.h>
#include <libavutil/log.h>
}

#include <cstdarg>
#include <mutex>
#include <string>

namespace epd::internal {
namespace {

// FFmpeg's last error-level log line on this thread.
thread_local std::string t_ffmpeg_error;

void CaptureFfmpegLog(void* avcl, int level, const char* fmt, va_list vl) {
  if (level > AV_LOG_ERROR) return;
  char line[512];
  int print_prefix = 0;
  av_log_format_line2(avcl, level, fmt, vl, line, sizeof(line), &print_prefix);
  std::string msg(line);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  if (!msg.empty()) t_ffmpeg_error = std::move(msg);
}

}  // namespace

void StartFfmpegLog() {
  static std::once_flag once;
  std::call_once(once, [] {
    av_log_set_level(AV_LOG_ERROR);
    av_log_set_callback(&CaptureFfmpegLog);
  });
  t_ffmpeg_error.clear();
}

std::string AvError(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(err, buf, sizeof(buf));
  return buf;
}

std::string FfmpegSays() {
  std::string said = t_ffmpeg_error.empty() ? "" : "; FFmpeg: " + t_ffmpeg_error;
  t_ffmpeg_error.clear();
  return said;
}

std::string OpenFailureReason(int err) {
  if (t_ffmpeg_error.empty()) return AvError(err);
  std::string said = "FFmpeg: " + t_ffmpeg_error;
  t_ffmpeg_error.clear();
  return said;
}

}  // namespace epd::internal
