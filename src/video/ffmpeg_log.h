// src/video/ffmpeg_log.h (internal to epd::video): FFmpeg's error text for
// Status messages.
//
// FFmpeg often says why it failed (e.g. "Picture size 100000x100000 is
// invalid") only in its log, and its return code is generic. Once per
// process its logging is routed to a callback that prints nothing and keeps
// the calling thread's last error-level line; the decoder adds that line to
// its messages. A decoder's own worker threads log into their own copy,
// which nobody reads.
//
// Thread safety: every function is thread-safe; the kept line is the calling
// thread's.
#pragma once

#include <string>

namespace epd::internal {

// Routes FFmpeg's logging here (the first call in the process) and forgets
// this thread's kept line: call before each decode.
void StartFfmpegLog();

// av_strerror's text for `err`.
std::string AvError(int err);

// "; FFmpeg: <line>" when FFmpeg logged an error line on this thread since
// the last call (which it then forgets), else "".
std::string FfmpegSays();

// Why FFmpeg failed to open a container: its kept line when it logged one,
// else AvError(err). The line comes first because a demuxer's return code
// can be wrong: for a picture size it refuses, the Y4M demuxer returns
// AVERROR(EINVAL) plus its 6-byte "FRAME\n" magic, which av_strerror renders
// as "Device or resource busy".
std::string OpenFailureReason(int err);

}  // namespace epd::internal
