// Container decoding with FFmpeg, sampled as qwen-vl-utils does.
//
// Design:
//   - The bytes are read through an AVIOContext over the caller's span (no
//     temporary file, no copy of the container).
//   - Every limit that bounds an allocation is checked against the header
//     before FFmpeg is asked to read a frame: avformat_open_input reads the
//     header only, then the claimed size, duration and frame count are
//     checked, and only then does avformat_find_stream_info decode a frame
//     or two (with the decoder's own max_pixels set to the limit, so a
//     bitstream that claims more than the container does is refused by the
//     decoder too). A Y4M header claiming 100000x100000 would otherwise make
//     the demuxer allocate a 15 GB packet.
//   - The frame count that sampling uses is the number of packets of the
//     video stream, counted in a demux-only pass (cheap: no decoding). It is
//     what decord's len(VideoReader) and the MP4 sample table report, and it
//     is known for containers without a count in the header (WebM).
//     torchvision's read_video counts decoded frames instead; the two agree
//     whenever every packet holds one frame (H.264, VP9, MPEG-4 part 2 as
//     FFmpeg packetises them). A stream that then decodes to fewer frames
//     than a sampled index is refused as corrupt rather than resampled.
//   - The second pass reopens the container (robust for demuxers that cannot
//     seek), decodes sequentially, keeps only the sampled frames, converts
//     each to RGB24 at its source size with swscale, and resizes it with
//     epd::ResizeRgb, the image path's resampler, so a video frame and the
//     same picture sent as an image become identical pixels.
//   - Rotation: the display matrix (the container's, else the first decoded
//     frame's) is read as a VideoOrientation and each sampled frame turned
//     and flipped at its source size, before the resize, as ffmpeg's
//     autorotate filters it before scaling (video_orientation.h).
//   - FFmpeg's own logging is routed, once per process, to a callback that
//     prints nothing and keeps the thread's last error line, which is added
//     to the Status message (FFmpeg's return codes alone are often generic;
//     ffmpeg_log.h).
//
// Benefits: no temp files; memory is bounded by the limits (sampled frames
// after resize, plus one decoded frame and FFmpeg's reference frames).
// Costs: the container is demuxed twice and the header parsed twice; both
// are small next to decoding.
#include "epd/video/video_decoder.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "decode_budget.h"
#include "ffmpeg_log.h"
#include "video_orientation.h"

namespace epd {
namespace {

using internal::AvError;
using internal::CheckDecodeWork;
using internal::DecodeBudget;
using internal::FfmpegSays;
using internal::Num;
using internal::OpenFailureReason;
using internal::StartFfmpegLog;

constexpr int kIoBufferSize = 64 * 1024;

// The caller's bytes as an FFmpeg byte stream.
struct MemoryReader {
  std::span<const std::uint8_t> bytes;
  std::int64_t pos = 0;

  static int Read(void* opaque, std::uint8_t* buf, int size) {
    auto* r = static_cast<MemoryReader*>(opaque);
    const std::int64_t left = static_cast<std::int64_t>(r->bytes.size()) - r->pos;
    if (left <= 0) return AVERROR_EOF;
    const int n = static_cast<int>(std::min<std::int64_t>(left, size));
    std::memcpy(buf, r->bytes.data() + r->pos, static_cast<std::size_t>(n));
    r->pos += n;
    return n;
  }

  static std::int64_t Seek(void* opaque, std::int64_t offset, int whence) {
    auto* r = static_cast<MemoryReader*>(opaque);
    const std::int64_t size = static_cast<std::int64_t>(r->bytes.size());
    if (whence & AVSEEK_SIZE) return size;
    std::int64_t base;
    switch (whence & ~AVSEEK_FORCE) {
      case SEEK_SET:
        base = 0;
        break;
      case SEEK_CUR:
        base = r->pos;
        break;
      case SEEK_END:
        base = size;
        break;
      default:
        return AVERROR(EINVAL);
    }
    // Offsets come from the container; refuse overflow and negatives.
    if ((offset > 0 && base > INT64_MAX - offset) || base + offset < 0) return AVERROR(EINVAL);
    r->pos = base + offset;
    return r->pos;
  }
};

// One opened container: format context over a MemoryReader. Owns every
// FFmpeg object it creates.
class Demuxer {
 public:
  Demuxer() = default;
  Demuxer(const Demuxer&) = delete;
  Demuxer& operator=(const Demuxer&) = delete;
  ~Demuxer() {
    avformat_close_input(&fmt_);  // custom IO: pb is ours to free
    if (avio_ != nullptr) {
      av_freep(&avio_->buffer);
      avio_context_free(&avio_);
    }
  }

  // Opens the container, checks the header against `limits`, then reads
  // stream info. On success stream() is the video stream and info() filled.
  Status Open(std::span<const std::uint8_t> bytes, const VideoLimits& limits);

  AVFormatContext* fmt() const { return fmt_; }
  AVStream* stream() const { return stream_; }
  const AVCodec* decoder() const { return decoder_; }
  const VideoInfo& info() const { return info_; }

 private:
  Status CheckHeader(const VideoLimits& limits) const;
  // Open's steps: the custom I/O and the header; stream info (which decodes
  // a few frames); the video stream, info_ and its decoder.
  Status OpenInput(std::span<const std::uint8_t> bytes);
  Status FindStreamInfo(const VideoLimits& limits);
  Status ChooseStream(const VideoLimits& limits);

  MemoryReader reader_;
  AVIOContext* avio_ = nullptr;
  AVFormatContext* fmt_ = nullptr;
  AVStream* stream_ = nullptr;
  const AVCodec* decoder_ = nullptr;
  VideoInfo info_;
};

double StreamFps(const AVStream* st) {
  if (st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0) return av_q2d(st->avg_frame_rate);
  if (st->r_frame_rate.num > 0 && st->r_frame_rate.den > 0) return av_q2d(st->r_frame_rate);
  return 0;
}

// The longest duration the container claims: the stream's, or the file's.
double ClaimedDuration(const AVFormatContext* fmt, const AVStream* st) {
  double d = 0;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0 && st->time_base.den > 0) {
    d = static_cast<double>(st->duration) * av_q2d(st->time_base);
  }
  if (fmt->duration != AV_NOPTS_VALUE && fmt->duration > 0) {
    d = std::max(d, static_cast<double>(fmt->duration) / AV_TIME_BASE);
  }
  return d;
}

// The (height, width) sampling resizes from: as shown under `o`.
StatusOr<ResizedSize> ShownFrameSize(const VideoInfo& info, const VideoOrientation& o, std::int64_t nframes,
                                     const VideoSampling& s, const PreprocessConfig& cfg) {
  if (Status st = internal::CheckQuarterTurn(o); !st.ok()) return st;
  return o.swaps_axes() ? VideoFrameSize(info.width, info.height, nframes, s, cfg)
                        : VideoFrameSize(info.height, info.width, nframes, s, cfg);
}

bool IsVideo(const AVStream* st) {
  return st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO && !(st->disposition & AV_DISPOSITION_ATTACHED_PIC);
}

Status CheckSize(const AVStream* st, const VideoLimits& limits) {
  const std::int64_t w = st->codecpar->width, h = st->codecpar->height;
  if (w > 0 && h > 0 && w * h > limits.max_source_pixels) {
    return InvalidArgument("video frame size " + std::to_string(w) + "x" + std::to_string(h) + " is " +
                           std::to_string(w * h) + " pixels, over the limit of " +
                           std::to_string(limits.max_source_pixels) + " (max_source_pixels)");
  }
  return Status::Ok();
}

Status Demuxer::CheckHeader(const VideoLimits& limits) const {
  for (unsigned i = 0; i < fmt_->nb_streams; ++i) {
    const AVStream* st = fmt_->streams[i];
    if (!IsVideo(st)) continue;
    if (Status s = CheckSize(st, limits); !s.ok()) return s;
    const double duration = ClaimedDuration(fmt_, st);
    if (duration > limits.max_duration_s) {
      return InvalidArgument("video duration " + Num(duration) + " s (as the container claims) is over the limit of " +
                             Num(limits.max_duration_s) + " s (max_duration_s)");
    }
    if (st->nb_frames > limits.max_source_frames) {
      return InvalidArgument("video stream claims " + std::to_string(st->nb_frames) + " frames, over the limit of " +
                             std::to_string(limits.max_source_frames) + " (max_source_frames)");
    }
    // Sampling spans the whole stream, so decoding reaches its last frame.
    if (Status s = CheckDecodeWork(st->nb_frames, st->codecpar->width, st->codecpar->height, limits); !s.ok()) return s;
  }
  return Status::Ok();
}

Status Demuxer::Open(std::span<const std::uint8_t> bytes, const VideoLimits& limits) {
  StartFfmpegLog();
  if (bytes.empty()) return InvalidArgument("video is empty (0 bytes)");
  if (Status s = OpenInput(bytes); !s.ok()) return s;
  if (Status s = CheckHeader(limits); !s.ok()) return s;
  if (Status s = FindStreamInfo(limits); !s.ok()) return s;
  return ChooseStream(limits);
}

Status Demuxer::OpenInput(std::span<const std::uint8_t> bytes) {
  reader_ = MemoryReader{bytes, 0};
  auto* buf = static_cast<std::uint8_t*>(av_malloc(kIoBufferSize));
  if (buf == nullptr) return ResourceExhausted("FFmpeg could not allocate an I/O buffer");
  avio_ = avio_alloc_context(buf, kIoBufferSize, 0, &reader_, &MemoryReader::Read, nullptr, &MemoryReader::Seek);
  if (avio_ == nullptr) {
    av_free(buf);
    return ResourceExhausted("FFmpeg could not allocate an I/O context");
  }
  fmt_ = avformat_alloc_context();
  if (fmt_ == nullptr) return ResourceExhausted("FFmpeg could not allocate a format context");
  fmt_->pb = avio_;
  fmt_->flags |= AVFMT_FLAG_CUSTOM_IO;
  // Reads the header only (on failure FFmpeg frees fmt_ and nulls it).
  if (int err = avformat_open_input(&fmt_, nullptr, nullptr, nullptr); err < 0) {
    return InvalidArgument("not a readable video container: corrupt, truncated or an unknown format (" +
                           OpenFailureReason(err) + ")");
  }
  return Status::Ok();
}

Status Demuxer::FindStreamInfo(const VideoLimits& limits) {
  // Stream info decodes a few frames: cap every video decoder it opens.
  std::vector<AVDictionary*> opts(fmt_->nb_streams, nullptr);
  for (unsigned i = 0; i < fmt_->nb_streams; ++i) {
    av_dict_set_int(&opts[i], "max_pixels", limits.max_source_pixels, 0);
  }
  const int err = avformat_find_stream_info(fmt_, opts.data());
  for (AVDictionary*& d : opts) av_dict_free(&d);
  if (err < 0) return InvalidArgument("corrupt or truncated video container (" + AvError(err) + FfmpegSays() + ")");
  return Status::Ok();
}

Status Demuxer::ChooseStream(const VideoLimits& limits) {
  const int index = av_find_best_stream(fmt_, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (index < 0 || !IsVideo(fmt_->streams[index])) {
    return InvalidArgument(std::string("container (") + fmt_->iformat->name + ") has no video stream");
  }
  stream_ = fmt_->streams[index];
  const AVCodecParameters* par = stream_->codecpar;
  // find_stream_info may have learnt the size from the bitstream.
  if (Status s = CheckHeader(limits); !s.ok()) return s;

  info_.container = fmt_->iformat->name;
  info_.codec = avcodec_get_name(par->codec_id);
  info_.width = par->width;
  info_.height = par->height;
  info_.fps = StreamFps(stream_);
  info_.duration_s = ClaimedDuration(fmt_, stream_);
  info_.frames = stream_->nb_frames > 0 ? stream_->nb_frames
                                        : static_cast<std::int64_t>(std::llround(info_.duration_s * info_.fps));
  info_.orientation = internal::StreamOrientation(stream_);

  decoder_ = avcodec_find_decoder(par->codec_id);
  if (decoder_ == nullptr) {
    char tag[AV_FOURCC_MAX_STRING_SIZE] = {0};
    av_fourcc_make_string(tag, par->codec_tag);
    return InvalidArgument("unsupported video codec '" + info_.codec + "' (tag " + tag +
                           "): this FFmpeg build has no decoder for it");
  }
  if (info_.width < 1 || info_.height < 1) {
    return InvalidArgument("video stream has no frame size (" + std::to_string(info_.width) + "x" +
                           std::to_string(info_.height) + ")");
  }
  if (!(info_.fps > 0) || !std::isfinite(info_.fps)) {
    return InvalidArgument("video stream has no frame rate");
  }
  if (info_.frames > limits.max_source_frames) {
    return InvalidArgument("video stream claims about " + std::to_string(info_.frames) + " frames, over the limit of " +
                           std::to_string(limits.max_source_frames) + " (max_source_frames)");
  }
  return Status::Ok();
}

// Demux-only pass: the number of packets of the video stream.
StatusOr<std::int64_t> CountPackets(Demuxer& d, const VideoLimits& limits) {
  AVPacket* pkt = av_packet_alloc();
  if (pkt == nullptr) return ResourceExhausted("FFmpeg could not allocate a packet");
  std::int64_t count = 0;
  int err;
  while ((err = av_read_frame(d.fmt(), pkt)) >= 0) {
    if (pkt->stream_index == d.stream()->index) {
      if (pkt->flags & AV_PKT_FLAG_CORRUPT) {
        av_packet_free(&pkt);
        return InvalidArgument("corrupt or truncated video container: frame " + std::to_string(count) +
                               " is damaged or cut short" + FfmpegSays());
      }
      ++count;
    }
    av_packet_unref(pkt);
    if (count > limits.max_source_frames) {
      av_packet_free(&pkt);
      return InvalidArgument("video stream has more than " + std::to_string(limits.max_source_frames) +
                             " frames (max_source_frames)");
    }
  }
  av_packet_free(&pkt);
  if (err != AVERROR_EOF) {
    return InvalidArgument("corrupt or truncated video container after " + std::to_string(count) + " frames (" +
                           AvError(err) + FfmpegSays() + ")");
  }
  // A sample table (MP4) that lists more frames than the file holds: cut.
  if (d.stream()->nb_frames > 0 && count < d.stream()->nb_frames) {
    return InvalidArgument("corrupt or truncated video container: the header lists " +
                           std::to_string(d.stream()->nb_frames) + " frames, the file holds " + std::to_string(count));
  }
  return count;
}

struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

// Converts one decoded frame to RGB24 at its own size. `sws` is reused while
// the source geometry stays the same.
StatusOr<RgbImage> ToRgb(const AVFrame* frame, std::unique_ptr<SwsContext, SwsDeleter>& sws) {
  if (frame->width < 1 || frame->height < 1) return InvalidArgument("decoded video frame has no size");
  SwsContext* ctx = sws_getCachedContext(sws.release(), frame->width, frame->height,
                                         static_cast<AVPixelFormat>(frame->format), frame->width, frame->height,
                                         AV_PIX_FMT_RGB24, SWS_BICUBIC | SWS_ACCURATE_RND, nullptr, nullptr, nullptr);
  sws.reset(ctx);
  if (ctx == nullptr) {
    const char* name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(frame->format));
    return InvalidArgument(std::string("unsupported video pixel format ") + (name ? name : "(unknown)"));
  }
  // The frame's own matrix (BT.601 when unspecified, as FFmpeg's CLI does)
  // and range.
  const int cs = frame->colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : static_cast<int>(frame->colorspace);
  const int src_range = frame->color_range == AVCOL_RANGE_JPEG ? 1 : 0;
  sws_setColorspaceDetails(ctx, sws_getCoefficients(cs), src_range, sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16,
                           1 << 16);
  RgbImage out;
  out.width = frame->width;
  out.height = frame->height;
  out.pixels.resize(static_cast<std::size_t>(out.width) * static_cast<std::size_t>(out.height) * 3);
  std::uint8_t* dst[4] = {out.pixels.data(), nullptr, nullptr, nullptr};
  int dst_stride[4] = {out.width * 3, 0, 0, 0};
  if (sws_scale(ctx, frame->data, frame->linesize, 0, frame->height, dst, dst_stride) != frame->height) {
    return Internal("swscale failed converting a " + std::to_string(frame->width) + "x" +
                    std::to_string(frame->height) + " frame to RGB24");
  }
  return out;
}

}  // namespace

StatusOr<VideoInfo> ProbeVideo(std::span<const std::uint8_t> bytes, const VideoLimits& limits) {
  Demuxer d;
  if (Status s = d.Open(bytes, limits); !s.ok()) return s;
  return d.info();
}

StatusOr<GridTHW> VideoHeaderGrid(const VideoInfo& info, const VideoSampling& s, const PreprocessConfig& cfg) {
  if (Status st = cfg.Validate(); !st.ok()) return st;
  StatusOr<std::int64_t> nframes = SampleFrameCount(s, info.frames, info.fps, cfg.temporal_patch_size);
  if (!nframes.ok()) return nframes.status();
  StatusOr<ResizedSize> size =
      ShownFrameSize(info, s.apply_rotation ? info.orientation : VideoOrientation{}, *nframes, s, cfg);
  if (!size.ok()) return size.status();
  return GridTHW{*nframes / cfg.temporal_patch_size, size->height / cfg.patch_size, size->width / cfg.patch_size};
}

namespace {

// What pass 1 decides: the source's frame count and which frames to keep,
// turned and resized how.
struct DecodePlan {
  VideoInfo info;
  std::int64_t total = 0;             // packets of the video stream
  std::int64_t nframes = 0;           // frames sampled
  std::vector<std::int64_t> indices;  // their source indices, ascending
  VideoOrientation orientation;
  ResizedSize size;
};

// Pass 1: header, limits, frame count; then the sampling and its limits.
StatusOr<DecodePlan> PlanDecode(std::span<const std::uint8_t> bytes, const VideoSampling& sampling,
                                const PreprocessConfig& cfg, const VideoLimits& limits, DecodeBudget& budget) {
  DecodePlan p;
  {
    Demuxer d;
    if (Status s = d.Open(bytes, limits); !s.ok()) return s;
    p.info = d.info();
    StatusOr<std::int64_t> n = CountPackets(d, limits);
    if (!n.ok()) return n.status();
    p.total = *n;
  }
  if (p.total == 0) return InvalidArgument("video stream has no frames");
  StatusOr<std::int64_t> nframes = SampleFrameCount(sampling, p.total, p.info.fps, cfg.temporal_patch_size);
  if (!nframes.ok()) return nframes.status();
  p.nframes = *nframes;
  p.indices = SampleFrameIndices(p.total, p.nframes);
  // Frames decode in order, up to the last sampled one.
  if (Status s = CheckDecodeWork(p.indices.back() + 1, p.info.width, p.info.height, limits); !s.ok()) return s;
  if (Status s = budget.Between(); !s.ok()) return s;
  p.orientation = sampling.apply_rotation ? p.info.orientation : VideoOrientation{};
  StatusOr<ResizedSize> size = ShownFrameSize(p.info, p.orientation, p.nframes, sampling, cfg);
  if (!size.ok()) return size.status();
  p.size = *size;
  const double bytes_needed =
      static_cast<double>(p.nframes) * static_cast<double>(p.size.height) * static_cast<double>(p.size.width) * 3.0;
  if (bytes_needed > static_cast<double>(limits.max_decoded_bytes)) {
    return InvalidArgument("video samples " + std::to_string(p.nframes) + " frames of " + std::to_string(p.size.width) +
                           "x" + std::to_string(p.size.height) + ", " + Num(bytes_needed) +
                           " bytes of RGB8, over the limit of " + std::to_string(limits.max_decoded_bytes) +
                           " (max_decoded_bytes)");
  }
  return p;
}

// Pass 2: decodes sequentially and keeps the planned frames.
struct FrameSampler {
  const VideoSampling& sampling;
  const PreprocessConfig& cfg;
  DecodeBudget& budget;
  DecodePlan& plan;
  std::unique_ptr<AVCodecContext, CodecContextDeleter> codec{};
  std::unique_ptr<AVFrame, FrameDeleter> frame{};
  std::unique_ptr<SwsContext, SwsDeleter> sws{};
  AVRational tb{0, 1};
  std::int64_t start = 0;    // the stream's first timestamp
  std::int64_t decoded = 0;  // frames out of the decoder so far
  std::size_t next = 0;      // next wanted entry of plan.indices
  SampledVideo out{};

  bool done() const { return next >= plan.indices.size(); }
  Status OpenCodec(const Demuxer& d, const VideoLimits& limits);
  Status Run(Demuxer& d);
  Status Drain();
  Status Keep();
};

Status FrameSampler::OpenCodec(const Demuxer& d, const VideoLimits& limits) {
  codec.reset(avcodec_alloc_context3(d.decoder()));
  frame.reset(av_frame_alloc());
  if (!codec || !frame) return ResourceExhausted("FFmpeg could not allocate a decoder");
  if (int err = avcodec_parameters_to_context(codec.get(), d.stream()->codecpar); err < 0) {
    return InvalidArgument("video codec parameters are invalid (" + AvError(err) + ")");
  }
  codec->max_pixels = limits.max_source_pixels;
  codec->thread_count = 0;  // FFmpeg picks; output is the same for any count
  if (int err = avcodec_open2(codec.get(), d.decoder(), nullptr); err < 0) {
    return InvalidArgument("cannot open the " + plan.info.codec + " decoder (" + AvError(err) + ")");
  }
  tb = d.stream()->time_base;
  start = d.stream()->start_time == AV_NOPTS_VALUE ? 0 : d.stream()->start_time;
  out.frames.reserve(plan.indices.size());
  out.timestamps_s.reserve(plan.indices.size());
  return Status::Ok();
}

// Feeds the video stream's packets until every planned frame is kept.
Status FrameSampler::Run(Demuxer& d) {
  std::unique_ptr<AVPacket, PacketDeleter> pkt(av_packet_alloc());
  if (!pkt) return ResourceExhausted("FFmpeg could not allocate a decoder");
  while (!done() && av_read_frame(d.fmt(), pkt.get()) >= 0) {
    if (pkt->stream_index != d.stream()->index) {
      av_packet_unref(pkt.get());
      continue;
    }
    if (Status s = budget.Between(); !s.ok()) return s;
    int send;
    // EAGAIN: the decoder's output is full; drain it and send again.
    while ((send = avcodec_send_packet(codec.get(), pkt.get())) == AVERROR(EAGAIN)) {
      if (Status s = Drain(); !s.ok()) return s;
    }
    av_packet_unref(pkt.get());
    if (send < 0) {
      return InvalidArgument("corrupt video stream at frame " + std::to_string(decoded) + " (" + AvError(send) +
                             FfmpegSays() + ")");
    }
    if (Status s = Drain(); !s.ok()) return s;
  }
  if (!done()) {  // end of packets: flush the decoder's delayed frames
    avcodec_send_packet(codec.get(), nullptr);
    if (Status s = Drain(); !s.ok()) return s;
  }
  if (!done()) {
    return InvalidArgument("corrupt or truncated video: decoded " + std::to_string(decoded) + " frames of the " +
                           std::to_string(plan.total) + " the container holds");
  }
  return Status::Ok();
}

// Drains the decoder; returns an error or OK (EAGAIN/EOF are not errors).
Status FrameSampler::Drain() {
  for (;;) {
    const int err = avcodec_receive_frame(codec.get(), frame.get());
    if (err == AVERROR(EAGAIN) || err == AVERROR_EOF) return Status::Ok();
    if (err < 0) {
      return InvalidArgument("corrupt video stream at frame " + std::to_string(decoded) + " (" + AvError(err) +
                             FfmpegSays() + ")");
    }
    if (Status s = budget.Charge(frame->width, frame->height); !s.ok()) return s;
    if (!done() && decoded == plan.indices[next]) {
      if (Status s = Keep(); !s.ok()) return s;
    }
    ++decoded;
    av_frame_unref(frame.get());
  }
}

// Keeps the decoded frame: turned, converted, resized, and its time.
Status FrameSampler::Keep() {
  if (next == 0 && sampling.apply_rotation && plan.info.orientation.identity()) {
    // No container matrix: the bitstream's (a display-orientation
    // SEI), as ffmpeg's autorotate reads it. A swap keeps the bytes.
    plan.orientation = internal::FrameOrientation(frame.get());
    StatusOr<ResizedSize> shown_size = ShownFrameSize(plan.info, plan.orientation, plan.nframes, sampling, cfg);
    if (!shown_size.ok()) return shown_size.status();
    plan.size = *shown_size;
  }
  const ResizedSize* size = &plan.size;
  StatusOr<RgbImage> rgb = ToRgb(frame.get(), sws);
  if (!rgb.ok()) return rgb.status();
  const RgbImage shown = internal::OrientFrame(std::move(*rgb), plan.orientation);
  StatusOr<RgbImage> resized =
      ResizeRgb(shown, static_cast<int>(size->width), static_cast<int>(size->height), cfg.resample);
  if (!resized.ok()) return resized.status();
  out.frames.push_back(std::move(*resized));
  std::int64_t pts = frame->best_effort_timestamp;
  if (pts == AV_NOPTS_VALUE) pts = frame->pts;
  // No timestamp: the nominal one.
  const bool timed = pts != AV_NOPTS_VALUE && tb.den > 0;
  out.timestamps_s.push_back(timed ? static_cast<double>(pts - start) * av_q2d(tb)
                                   : static_cast<double>(decoded) / plan.info.fps);
  ++next;
  return Status::Ok();
}

}  // namespace

StatusOr<SampledVideo> DecodeVideo(std::span<const std::uint8_t> bytes, const VideoSampling& sampling,
                                   const PreprocessConfig& cfg, const VideoLimits& limits, std::stop_token stop) {
  if (Status s = sampling.Validate(); !s.ok()) return s;
  if (Status s = cfg.Validate(); !s.ok()) return s;
  DecodeBudget budget(limits, std::move(stop));
  if (Status s = budget.Between(); !s.ok()) return s;
  StatusOr<DecodePlan> plan = PlanDecode(bytes, sampling, cfg, limits, budget);
  if (!plan.ok()) return plan.status();
  Demuxer d;
  if (Status s = d.Open(bytes, limits); !s.ok()) return s;
  FrameSampler sampler{sampling, cfg, budget, *plan};
  if (Status s = sampler.OpenCodec(d, limits); !s.ok()) return s;
  if (Status s = sampler.Run(d); !s.ok()) return s;
  SampledVideo out = std::move(sampler.out);
  const std::int64_t T = cfg.temporal_patch_size;
  out.grid = GridTHW{plan->nframes / T, plan->size.height / cfg.patch_size, plan->size.width / cfg.patch_size};
  // qwen-vl-utils: sample_fps = nframes / max(total_frames, 1e-6) * video_fps.
  out.sample_fps =
      static_cast<double>(plan->nframes) / std::max(static_cast<double>(plan->total), 1e-6) * plan->info.fps;
  out.seconds_per_grid_t = static_cast<double>(T) / out.sample_fps;
  out.source_frames = plan->total;
  out.source_fps = plan->info.fps;
  return out;
}

}  // namespace epd
