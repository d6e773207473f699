// The client side of the EncodedItem conversion (client_convert.h).
#include "client_convert.h"

#include <cstring>
#include <memory>
#include <string>

#include "proto_convert.h"

namespace epd::internal {

namespace {

// The non-payload part shared by both deliveries: index, key, source, times,
// server id, and the error if the item failed.
ClientItemResult Header(const v1::EncodedItem& m) {
  ClientItemResult r;
  r.index = m.index();
  if (m.key().size() == r.key.bytes.size()) std::memcpy(r.key.bytes.data(), m.key().data(), r.key.bytes.size());
  r.source = FromProto(m.source());
  r.queue_ms = m.queue_ms();
  r.tower_ms = m.tower_ms();
  r.total_ms = m.total_ms();
  r.server_id = m.server_id();
  if (m.error_code() != 0) r.status = Status(static_cast<StatusCode>(m.error_code()), m.error_message());
  return r;
}

// An empty grid_thw (an older server) leaves the grid unknown; a present one
// must be 3 positive values.
template <class Message>  // v1::EncodedItem or v1::ProbedItem
Status GridFromProto(const Message& m, GridTHW* grid) {
  if (m.grid_thw_size() == 0) return Status::Ok();
  if (m.grid_thw_size() != 3 || m.grid_thw(0) <= 0 || m.grid_thw(1) <= 0 || m.grid_thw(2) <= 0) {
    std::string got;
    for (std::int64_t v : m.grid_thw()) got += (got.empty() ? "" : ", ") + std::to_string(v);
    return Internal("server sent item " + std::to_string(m.index()) + " with grid_thw [" + got +
                    "]; expected 3 positive values [t, h, w]");
  }
  *grid = {m.grid_thw(0), m.grid_thw(1), m.grid_thw(2)};
  return Status::Ok();
}

// The item's shape, its dtype parsed; Internal naming the item (`via`, e.g.
// "by CUDA IPC ", says how it came) when the server sent an unknown dtype.
StatusOr<EmbeddingShape> ShapeFromProto(const v1::EncodedItem& m, const std::string& via = "") {
  StatusOr<DType> dtype = FromProto(m.dtype());
  if (!dtype.ok()) {
    return Internal("server sent item " + std::to_string(m.index()) + " " + via + "with " + dtype.status().message());
  }
  return EmbeddingShape{m.tokens(), m.hidden(), m.deepstack_layers(), *dtype};
}

}  // namespace

ClientItemResult FromProto(const v1::EncodedItem& m) {
  ClientItemResult r = Header(m);
  if (!r.status.ok()) return r;
  StatusOr<EmbeddingShape> shape = ShapeFromProto(m);
  if (!shape.ok()) {
    r.status = shape.status();
    return r;
  }
  auto e = std::make_shared<Embedding>();
  static_cast<EmbeddingShape&>(*e) = *shape;
  const auto* main = reinterpret_cast<const std::byte*>(m.main().data());
  const auto* deep = reinterpret_cast<const std::byte*>(m.deepstack().data());
  e->main.assign(main, main + m.main().size());
  e->deepstack.assign(deep, deep + m.deepstack().size());
  if (e->tokens < 0 || e->hidden < 0 || e->deepstack_layers < 0 || e->nbytes() != e->ExpectedBytes() ||
      e->main.size() != static_cast<std::size_t>(e->tokens * e->hidden) * DTypeSize(e->dtype)) {
    r.status =
        Internal("server sent item " + std::to_string(m.index()) + " whose " + std::to_string(e->main.size()) + "+" +
                 std::to_string(e->deepstack.size()) + " bytes do not match its shape [" + std::to_string(e->tokens) +
                 ", " + std::to_string(e->hidden) + "] x " + std::to_string(1 + e->deepstack_layers));
    return r;
  }
  if (Status g = GridFromProto(m, &e->grid); !g.ok()) {
    r.status = g;
    return r;
  }
  if (m.timestamps_s_size() != 0 || m.seconds_per_grid_t() != 0) {
    auto timing = std::make_shared<VideoTiming>();
    timing->timestamps_s.assign(m.timestamps_s().begin(), m.timestamps_s().end());
    timing->sample_fps = m.sample_fps();
    timing->seconds_per_grid_t = m.seconds_per_grid_t();
    r.video = std::move(timing);
  }
  r.embedding = std::move(e);
  return r;
}

ClientItemResult FromProtoShm(const v1::EncodedItem& m, EmbeddingShape* shape, GridTHW* grid) {
  ClientItemResult r = Header(m);
  if (!r.status.ok()) return r;
  StatusOr<EmbeddingShape> parsed = ShapeFromProto(m);
  if (!parsed.ok()) {
    r.status = parsed.status();
    return r;
  }
  *shape = *parsed;
  const v1::ShmRef& ref = m.shm();
  if (shape->tokens < 0 || shape->hidden < 0 || shape->deepstack_layers < 0 || ref.length() != shape->nbytes() ||
      ref.offset() > ref.segment_bytes() || ref.length() > ref.segment_bytes() - ref.offset()) {
    r.status =
        Internal("server sent item " + std::to_string(m.index()) + " by reference: " + std::to_string(ref.length()) +
                 " bytes at offset " + std::to_string(ref.offset()) + " of a " + std::to_string(ref.segment_bytes()) +
                 "-byte arena, for shape [" + std::to_string(shape->tokens) + ", " + std::to_string(shape->hidden) +
                 "] x " + std::to_string(1 + shape->deepstack_layers));
    return r;
  }
  if (Status g = GridFromProto(m, grid); !g.ok()) r.status = g;
  return r;
}

ClientItemResult FromProtoIpc(const v1::EncodedItem& m, EmbeddingShape* shape, GridTHW* grid, IpcHandle* handle) {
  ClientItemResult r = Header(m);
  if (!r.status.ok()) return r;
  const std::string at = "server sent item " + std::to_string(m.index()) + " by CUDA IPC ";
  StatusOr<EmbeddingShape> parsed = ShapeFromProto(m, "by CUDA IPC ");
  if (!parsed.ok()) {
    r.status = parsed.status();
    return r;
  }
  *shape = *parsed;
  const v1::CudaIpcRef& ref = m.cuda_ipc();
  if (ref.memory_handle().size() != IpcHandle::kHandleBytes || ref.event_handle().size() != IpcHandle::kHandleBytes) {
    r.status = Internal(at + "with a " + std::to_string(ref.memory_handle().size()) + "-byte memory handle and a " +
                        std::to_string(ref.event_handle().size()) + "-byte event handle; both must be " +
                        std::to_string(IpcHandle::kHandleBytes) + " bytes");
    return r;
  }
  if (shape->tokens < 0 || shape->hidden < 0 || shape->deepstack_layers < 0 || ref.length() == 0 ||
      ref.length() != shape->nbytes() || ref.deepstack_offset() != shape->main_bytes()) {
    r.status = Internal(at + "with " + std::to_string(ref.length()) + " bytes, deepstack at byte " +
                        std::to_string(ref.deepstack_offset()) + ", for shape [" + std::to_string(shape->tokens) +
                        ", " + std::to_string(shape->hidden) + "] x " + std::to_string(1 + shape->deepstack_layers));
    return r;
  }
  std::memcpy(handle->memory.data(), ref.memory_handle().data(), IpcHandle::kHandleBytes);
  std::memcpy(handle->event.data(), ref.event_handle().data(), IpcHandle::kHandleBytes);
  handle->bytes = ref.length();
  if (Status g = GridFromProto(m, grid); !g.ok()) r.status = g;
  return r;
}

ClientProbeItem FromProto(const v1::ProbedItem& m) {
  ClientProbeItem r;
  r.index = m.index();
  if (m.error_code() != 0) {
    r.status =
        Status(static_cast<StatusCode>(m.error_code()), "item " + std::to_string(m.index()) + ": " + m.error_message());
    return r;
  }
  if (m.key().size() != r.key.bytes.size() || m.route_key().size() != r.route_key.bytes.size()) {
    r.status =
        Internal("server sent probed item " + std::to_string(m.index()) + " with a " + std::to_string(m.key().size()) +
                 "-byte key and a " + std::to_string(m.route_key().size()) + "-byte route key; expected 32 bytes each");
    return r;
  }
  std::memcpy(r.key.bytes.data(), m.key().data(), r.key.bytes.size());
  std::memcpy(r.route_key.bytes.data(), m.route_key().data(), r.route_key.bytes.size());
  if (Status g = GridFromProto(m, &r.grid); !g.ok()) r.status = g;
  r.tokens = m.tokens();
  return r;
}

}  // namespace epd::internal
