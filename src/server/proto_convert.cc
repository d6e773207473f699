#include "proto_convert.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace epd::internal {

v1::DType ToProto(DType d) {
  switch (d) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

StatusOr<DType> FromProto(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    default:
      break;
  }
  return InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(d)));
}

v1::Source ToProto(ItemSource s) {
  switch (s) {
    case ItemSource::kL1:
      return v1::SOURCE_L1;
    case ItemSource::kL2:
      return v1::SOURCE_L2;
    case ItemSource::kMiss:
      return v1::SOURCE_MISS;
    case ItemSource::kJoined:
      return v1::SOURCE_JOINED;
    case ItemSource::kL3:
      return v1::SOURCE_L3;
  }
  return v1::SOURCE_UNSPECIFIED;
}

ItemSource FromProto(v1::Source s) {
  switch (s) {
    case v1::SOURCE_L1:
      return ItemSource::kL1;
    case v1::SOURCE_L2:
      return ItemSource::kL2;
    case v1::SOURCE_JOINED:
      return ItemSource::kJoined;
    case v1::SOURCE_L3:
      return ItemSource::kL3;
    default:
      return ItemSource::kMiss;
  }
}

void ToProto(const PreprocessConfig& cfg, v1::PreprocessConfig* out) {
  out->set_patch_size(cfg.patch_size);
  out->set_merge_size(cfg.merge_size);
  out->set_temporal_patch_size(cfg.temporal_patch_size);
  out->set_min_pixels(cfg.min_pixels);
  out->set_max_pixels(cfg.max_pixels);
  out->clear_mean();
  out->clear_std();
  for (float m : cfg.mean) out->add_mean(m);
  for (float s : cfg.std) out->add_std(s);
  out->set_resample(static_cast<std::int64_t>(cfg.resample));
  out->set_apply_exif_orientation(cfg.decode.apply_exif_orientation);
  out->set_rgba_composite(cfg.decode.alpha.composite);
  out->clear_rgba_background();
  for (std::uint8_t c : cfg.decode.alpha.background) out->add_rgba_background(c);
}

StatusOr<PreprocessConfig> FromProto(const v1::PreprocessConfig& p) {
  if (p.mean_size() != 3 || p.std_size() != 3) {
    return InvalidArgument("preprocess config needs 3 mean and 3 std values, got " + std::to_string(p.mean_size()) +
                           " and " + std::to_string(p.std_size()));
  }
  PreprocessConfig cfg;
  cfg.patch_size = static_cast<int>(p.patch_size());
  cfg.merge_size = static_cast<int>(p.merge_size());
  cfg.temporal_patch_size = static_cast<int>(p.temporal_patch_size());
  cfg.min_pixels = p.min_pixels();
  cfg.max_pixels = p.max_pixels();
  for (int i = 0; i < 3; ++i) {
    cfg.mean[i] = p.mean(i);
    cfg.std[i] = p.std(i);
  }
  cfg.resample = static_cast<Resample>(p.resample());
  if (p.rgba_background_size() != 3) {
    return InvalidArgument("preprocess config needs 3 rgba_background values, got " +
                           std::to_string(p.rgba_background_size()));
  }
  cfg.decode.apply_exif_orientation = p.apply_exif_orientation();
  cfg.decode.alpha.composite = p.rgba_composite();
  for (int i = 0; i < 3; ++i) {
    if (p.rgba_background(i) > 255) {
      return InvalidArgument("rgba_background value " + std::to_string(p.rgba_background(i)) + " is over 255");
    }
    cfg.decode.alpha.background[i] = static_cast<std::uint8_t>(p.rgba_background(i));
  }
  return cfg;
}

void ToProto(const ItemResult& r, const std::string& server_id, v1::EncodedItem* out) {
  ToProto(r, server_id, out, nullptr);
}

void ToProto(const ItemResult& r, const std::string& server_id, v1::EncodedItem* out,
             const std::function<bool(const Embedding&, v1::EncodedItem*)>& place_payload) {
  out->set_index(r.index);
  out->set_key(reinterpret_cast<const char*>(r.key.bytes.data()), r.key.bytes.size());
  out->set_source(ToProto(r.source));
  out->set_queue_ms(r.queue_ms);
  out->set_tower_ms(r.tower_ms);
  out->set_total_ms(r.total_ms);
  out->set_server_id(server_id);
  // Bytes in device or pinned memory (a GPU tier) are copied to the host to
  // ship; a host embedding is used as it is.
  Status s = r.status;
  if (s.ok() && r.embedding == nullptr) s = Internal("item has no embedding");
  StatusOr<EmbeddingPtr> host = EmbeddingPtr();
  if (s.ok()) {
    host = ToHost(r.embedding);
    if (!host.ok()) s = host.status();
  }
  if (!s.ok()) {
    out->set_error_code(static_cast<int>(s.code()));
    out->set_error_message(s.message());
    return;
  }
  const Embedding& e = **host;
  out->set_tokens(e.tokens);
  out->set_hidden(e.hidden);
  out->set_deepstack_layers(e.deepstack_layers);
  out->set_dtype(ToProto(e.dtype));
  if (e.grid.known()) {
    out->add_grid_thw(e.grid.t);
    out->add_grid_thw(e.grid.h);
    out->add_grid_thw(e.grid.w);
  }
  if (r.video != nullptr) {
    for (double ts : r.video->timestamps_s) out->add_timestamps_s(ts);
    out->set_sample_fps(r.video->sample_fps);
    out->set_seconds_per_grid_t(r.video->seconds_per_grid_t);
  }
  if (place_payload && place_payload(e, out)) return;
  out->set_main(reinterpret_cast<const char*>(e.main.data()), e.main.size());
  out->set_deepstack(reinterpret_cast<const char*>(e.deepstack.data()), e.deepstack.size());
}

namespace {

namespace pb = google::protobuf;

// The proto type that holds a member of type T.
template <typename T>
constexpr pb::FieldDescriptor::CppType kCppTypeOf =
    std::is_same_v<T, std::uint64_t>  ? pb::FieldDescriptor::CPPTYPE_UINT64
    : std::is_same_v<T, std::int64_t> ? pb::FieldDescriptor::CPPTYPE_INT64
    : std::is_same_v<T, double>       ? pb::FieldDescriptor::CPPTYPE_DOUBLE
                                      : pb::FieldDescriptor::CPPTYPE_BOOL;

void SetScalar(const pb::Reflection* r, pb::Message* m, const pb::FieldDescriptor* f, std::uint64_t v) {
  r->SetUInt64(m, f, v);
}
void SetScalar(const pb::Reflection* r, pb::Message* m, const pb::FieldDescriptor* f, std::int64_t v) {
  r->SetInt64(m, f, v);
}
void SetScalar(const pb::Reflection* r, pb::Message* m, const pb::FieldDescriptor* f, double v) {
  r->SetDouble(m, f, v);
}
void SetScalar(const pb::Reflection* r, pb::Message* m, const pb::FieldDescriptor* f, bool v) { r->SetBool(m, f, v); }
void GetScalar(const pb::Reflection* r, const pb::Message& m, const pb::FieldDescriptor* f, std::uint64_t& v) {
  v = r->GetUInt64(m, f);
}
void GetScalar(const pb::Reflection* r, const pb::Message& m, const pb::FieldDescriptor* f, std::int64_t& v) {
  v = r->GetInt64(m, f);
}
void GetScalar(const pb::Reflection* r, const pb::Message& m, const pb::FieldDescriptor* f, double& v) {
  v = r->GetDouble(m, f);
}
void GetScalar(const pb::Reflection* r, const pb::Message& m, const pb::FieldDescriptor* f, bool& v) {
  v = r->GetBool(m, f);
}

// A map field of the response, by its descriptor, through its generated
// accessor: never through reflection's repeated-field view of the map
// (AddMessage, GetRepeatedMessage). That view makes libprotobuf.so sync the
// map with a repeated field in its own MapFieldBase code, and protobuf 3.21's
// map_field.h gives MapFieldBase two more members when compiled with
// -fsanitize=thread: the TSan build's generated code and Debian's
// uninstrumented library then disagree on where repeated_field_ is, and
// AddMessage crashed in `make tsan` (docs/SANITIZERS.md). The generated
// Map is also the direct way: a lookup, not a scan of every entry.
using CounterMap = pb::Map<std::string, std::uint64_t>;
struct CounterMapField {
  int number;
  const CounterMap& (v1::StatsResponse::*get)() const;
  CounterMap* (v1::StatsResponse::*get_mutable)();
};
constexpr CounterMapField kCounterMaps[] = {
    {v1::StatsResponse::kItemErrorsFieldNumber, &v1::StatsResponse::item_errors,
     &v1::StatsResponse::mutable_item_errors},
    {v1::StatsResponse::kRpcErrorsFieldNumber, &v1::StatsResponse::rpc_errors, &v1::StatsResponse::mutable_rpc_errors},
    {v1::StatsResponse::kL3CountersFieldNumber, &v1::StatsResponse::l3_counters,
     &v1::StatsResponse::mutable_l3_counters},
    {v1::StatsResponse::kL3ErrorsFieldNumber, &v1::StatsResponse::l3_errors, &v1::StatsResponse::mutable_l3_errors},
    {v1::StatsResponse::kL3NodeErrorsFieldNumber, &v1::StatsResponse::l3_node_errors,
     &v1::StatsResponse::mutable_l3_node_errors},
};
const CounterMapField* CounterMapFor(const pb::FieldDescriptor* f) {
  for (const CounterMapField& c : kCounterMaps) {
    if (c.number == f->number()) return &c;
  }
  return nullptr;
}

// The StatsResponse field a table row names, when it exists and holds a T
// (for a map entry: one of kCounterMaps, the response's map<string, uint64>
// fields, and T uint64); null otherwise, and the row is skipped
// (stats_tables_test proves no row is).
template <typename T>
const pb::FieldDescriptor* FieldFor(const StatProto& p) {
  if (p.field.empty()) return nullptr;
  const pb::FieldDescriptor* f = v1::StatsResponse::descriptor()->FindFieldByName(std::string(p.field));
  if (f == nullptr) return nullptr;
  if (p.key.empty()) return !f->is_repeated() && f->cpp_type() == kCppTypeOf<T> ? f : nullptr;
  return std::is_same_v<T, std::uint64_t> && CounterMapFor(f) != nullptr ? f : nullptr;
}

// Writes each row of `table` with a proto field from `s` into `out`.
template <typename Table, typename S>
void StatsToProto(const Table& table, const S& s, v1::StatsResponse* out) {
  const pb::Reflection* r = out->GetReflection();
  for (const auto& row : table) {
    VisitStat(row, s, [&](const auto& v) {
      const pb::FieldDescriptor* f = FieldFor<std::decay_t<decltype(v)>>(row.proto);
      if (f == nullptr) return;
      if (row.proto.key.empty()) return SetScalar(r, out, f, v);
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::uint64_t>) {
        CounterMap& map = *(out->*(CounterMapFor(f)->get_mutable))();
        map[std::string(row.proto.key)] = v;
      }
    });
  }
}

// Reads each row of `table` with a proto field from `m` into `s` (a map entry
// that is absent leaves the member as it is).
template <typename Table, typename S>
void StatsFromProto(const Table& table, const v1::StatsResponse& m, S& s) {
  const pb::Reflection* r = m.GetReflection();
  for (const auto& row : table) {
    VisitStat(row, s, [&](auto& v) {
      const pb::FieldDescriptor* f = FieldFor<std::decay_t<decltype(v)>>(row.proto);
      if (f == nullptr) return;
      if (row.proto.key.empty()) return GetScalar(r, m, f, v);
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::uint64_t>) {
        const CounterMap& map = (m.*(CounterMapFor(f)->get))();
        if (auto it = map.find(std::string(row.proto.key)); it != map.end()) v = it->second;
      }
    });
  }
}

}  // namespace

// The numbers go by the field tables (epd/core/stat_fields.h); what is no
// number (the id and the by-code and by-kind maps) by hand. The L3 rows are
// sent only by a server with a tier: without one they are all zero anyway.
void ToProto(const ServerStats& s, v1::StatsResponse* out) {
  out->set_server_id(s.server_id);
  StatsToProto(kServerStatsFields, s, out);
  StatsToProto(kWorkerStatsFields, s.worker, out);
  StatsToProto(kShmStatsFields, s.shm, out);
  StatsToProto(kIpcStatsFields, s.ipc, out);
  for (const auto& [code, n] : s.worker.errors) {
    (*out->mutable_item_errors())[GrpcCodeName(static_cast<int>(code))] = n;
  }
  for (const auto& [code, n] : s.rpc_errors) (*out->mutable_rpc_errors())[GrpcCodeName(static_cast<int>(code))] = n;
  if (s.l3_enabled) {
    StatsToProto(kSharedTierStatsFields, s.l3, out);
    for (const auto& [kind, n] : s.l3.errors) (*out->mutable_l3_errors())[kind] = n;
    for (const auto& [node, n] : s.l3.node_errors) (*out->mutable_l3_node_errors())[node] = n;
  }
}

ServerStats FromProto(const v1::StatsResponse& m) {
  ServerStats s;
  s.server_id = m.server_id();
  StatsFromProto(kServerStatsFields, m, s);
  StatsFromProto(kWorkerStatsFields, m, s.worker);
  StatsFromProto(kShmStatsFields, m, s.shm);
  StatsFromProto(kIpcStatsFields, m, s.ipc);
  StatsFromProto(kSharedTierStatsFields, m, s.l3);
  for (const auto& [name, n] : m.item_errors()) s.worker.errors[CodeFromName(name)] += n;
  for (const auto& [name, n] : m.rpc_errors()) s.rpc_errors[CodeFromName(name)] += n;
  for (const auto& [kind, n] : m.l3_errors()) s.l3.errors[kind] = n;
  for (const auto& [node, n] : m.l3_node_errors()) s.l3.node_errors[node] = n;
  return s;
}

VideoSampling FromProto(const v1::VideoSampling& p, const VideoSampling& defaults) {
  VideoSampling s = defaults;
  if (p.fps() != 0) s.fps = p.fps();
  if (p.nframes() != 0) s.nframes = p.nframes();
  if (p.min_frames() != 0) s.min_frames = p.min_frames();
  if (p.max_frames() != 0) s.max_frames = p.max_frames();
  if (p.min_pixels() != 0) s.min_pixels = p.min_pixels();
  if (p.max_pixels() != 0) s.max_pixels = p.max_pixels();
  if (p.total_pixels() != 0) s.total_pixels = p.total_pixels();
  if (p.resized_height() != 0) s.resized_height = p.resized_height();
  if (p.resized_width() != 0) s.resized_width = p.resized_width();
  if (p.rotation() == v1::VIDEO_ROTATION_ON) s.apply_rotation = true;
  if (p.rotation() == v1::VIDEO_ROTATION_OFF) s.apply_rotation = false;
  return s;
}

void ToProto(const VideoSampling& s, v1::VideoSampling* out) {
  out->set_fps(s.fps);
  if (s.nframes.has_value()) out->set_nframes(*s.nframes);
  out->set_min_frames(s.min_frames);
  out->set_max_frames(s.max_frames);
  out->set_min_pixels(s.min_pixels);
  out->set_max_pixels(s.max_pixels);
  out->set_total_pixels(s.total_pixels);
  if (s.resized_height.has_value()) out->set_resized_height(*s.resized_height);
  if (s.resized_width.has_value()) out->set_resized_width(*s.resized_width);
  out->set_rotation(s.apply_rotation ? v1::VIDEO_ROTATION_ON : v1::VIDEO_ROTATION_OFF);
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

namespace {
// gRPC's canonical names, indexed by code (grpc/impl/codegen/status.h).
constexpr std::array<std::string_view, 17> kGrpcNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
}  // namespace

std::string GrpcCodeName(int code) {
  if (code >= 0 && code < static_cast<int>(kGrpcNames.size())) return std::string(kGrpcNames[code]);
  return "CODE_" + std::to_string(code);
}

StatusCode CodeFromName(std::string_view name) {
  for (std::size_t i = 0; i < kGrpcNames.size(); ++i) {
    if (kGrpcNames[i] == name) return static_cast<StatusCode>(i);
  }
  if (name.starts_with("CODE_")) return static_cast<StatusCode>(std::atoi(std::string(name.substr(5)).c_str()));
  return StatusCode::kUnknown;
}

}  // namespace epd::internal
