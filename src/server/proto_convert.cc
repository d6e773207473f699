#include "proto_convert.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
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

// The shared tier's counters by their StatsResponse.l3_counters names; the
// one list both directions use.
static std::vector<std::pair<const char*, std::uint64_t SharedTierStats::*>> L3CounterFields() {
  return {{"gets", &SharedTierStats::gets},
          {"hits", &SharedTierStats::hits},
          {"misses", &SharedTierStats::misses},
          {"corrupt", &SharedTierStats::corrupt},
          {"auth_failures", &SharedTierStats::auth_failures},
          {"lease_auth_failures", &SharedTierStats::lease_auth_failures},
          {"writes", &SharedTierStats::writes},
          {"write_bytes", &SharedTierStats::write_bytes},
          {"write_drops", &SharedTierStats::write_drops},
          {"leases_acquired", &SharedTierStats::leases_acquired},
          {"leases_released", &SharedTierStats::leases_released},
          {"lease_waits", &SharedTierStats::lease_waits},
          {"lease_wait_hits", &SharedTierStats::lease_wait_hits},
          {"lease_takeovers", &SharedTierStats::lease_takeovers},
          {"lease_wait_timeouts", &SharedTierStats::lease_wait_timeouts}};
}

void ToProto(const ServerStats& s, v1::StatsResponse* out) {
  const WorkerStats& w = s.worker;
  out->set_server_id(s.server_id);
  out->set_requests(w.requests);
  out->set_items(w.items);
  out->set_hits_l1(w.hits_l1);
  out->set_hits_l2(w.hits_l2);
  out->set_misses(w.misses);
  out->set_joins(w.joins);
  out->set_shape_mismatches(w.shape_mismatches);
  out->set_cache_errors(w.cache_errors);
  out->set_rejected_requests(w.rejected_requests);
  out->set_cancelled_requests(w.cancelled_requests);
  out->set_tower_batches(w.tower_batches);
  out->set_tower_items(w.tower_items);
  out->set_tower_tokens(w.tower_tokens);
  out->set_tower_seconds(w.tower_seconds);
  out->set_tower_failures(w.tower_failures);
  out->set_sink_full_stalls(w.sink_full_stalls);
  for (const auto& [code, n] : w.errors) (*out->mutable_item_errors())[GrpcCodeName(static_cast<int>(code))] = n;
  out->set_in_flight_requests(w.in_flight_requests);
  out->set_pending_items(w.pending_items);
  out->set_pending_tokens(w.pending_tokens);
  out->set_l1_evictions(w.l1_evictions);
  out->set_l2_evictions(w.l2_evictions);
  out->set_demotions(w.demotions);
  out->set_promotions(w.promotions);
  out->set_l1_used_bytes(w.l1_used_bytes);
  out->set_l2_used_bytes(w.l2_used_bytes);
  out->set_l1_entries(w.l1_entries);
  out->set_l2_entries(w.l2_entries);
  out->set_l1_capacity_bytes(s.l1_capacity_bytes);
  out->set_l2_capacity_bytes(s.l2_capacity_bytes);
  for (const auto& [code, n] : s.rpc_errors) (*out->mutable_rpc_errors())[GrpcCodeName(static_cast<int>(code))] = n;
  out->set_buffered_bytes(s.buffered_bytes);
  out->set_shm_capacity_bytes(s.shm.capacity_bytes);
  out->set_shm_leased_bytes(s.shm.leased_bytes);
  out->set_shm_leases(s.shm.leases);
  out->set_shm_items(s.shm.items);
  out->set_shm_fallbacks(s.shm.fallbacks);
  out->set_shm_released(s.shm.released);
  out->set_shm_expired(s.shm.expired);
  out->set_shm_refused_releases(s.shm.refused_releases);
  out->set_shm_reused(s.shm.reused);
  out->set_shm_evicted(s.shm.evicted);
  out->set_ipc_capacity_bytes(s.ipc.capacity_bytes);
  out->set_ipc_exported_bytes(s.ipc.exported_bytes);
  out->set_ipc_leases(s.ipc.leases);
  out->set_ipc_exports(s.ipc.exports);
  out->set_ipc_items(s.ipc.items);
  out->set_ipc_reused(s.ipc.reused);
  out->set_ipc_fallbacks(s.ipc.fallbacks);
  out->set_ipc_not_resident(s.ipc.not_resident);
  out->set_ipc_released(s.ipc.released);
  out->set_ipc_expired(s.ipc.expired);
  out->set_ipc_refused_releases(s.ipc.refused_releases);
  out->set_ipc_session_reclaimed(s.ipc.session_reclaimed);
  out->set_shm_sessions(s.shm.sessions);
  out->set_shm_sessions_opened(s.shm.sessions_opened);
  out->set_shm_sessions_refused(s.shm.sessions_refused);
  out->set_shm_session_reclaimed(s.shm.session_reclaimed);
  out->set_shm_session_unknown(s.shm.session_unknown);
  out->set_hits_l3(w.hits_l3);
  out->set_l3_enabled(s.l3_enabled);
  out->set_l3_degraded(s.l3.degraded);
  if (s.l3_enabled) {
    for (const auto& [name, field] : L3CounterFields()) (*out->mutable_l3_counters())[name] = s.l3.*field;
    for (const auto& [kind, n] : s.l3.errors) (*out->mutable_l3_errors())[kind] = n;
  }
  out->set_video_items(w.video_items);
  out->set_video_decodes(w.video_decodes);
  out->set_chunk_hits(w.chunk_hits);
  out->set_chunk_misses(w.chunk_misses);
  out->set_chunk_joins(w.chunk_joins);
}

ServerStats FromProto(const v1::StatsResponse& m) {
  ServerStats s;
  WorkerStats& w = s.worker;
  s.server_id = m.server_id();
  w.requests = m.requests();
  w.items = m.items();
  w.hits_l1 = m.hits_l1();
  w.hits_l2 = m.hits_l2();
  w.misses = m.misses();
  w.joins = m.joins();
  w.shape_mismatches = m.shape_mismatches();
  w.cache_errors = m.cache_errors();
  w.rejected_requests = m.rejected_requests();
  w.cancelled_requests = m.cancelled_requests();
  w.tower_batches = m.tower_batches();
  w.tower_items = m.tower_items();
  w.tower_tokens = m.tower_tokens();
  w.tower_seconds = m.tower_seconds();
  w.tower_failures = m.tower_failures();
  w.sink_full_stalls = m.sink_full_stalls();
  for (const auto& [name, n] : m.item_errors()) w.errors[CodeFromName(name)] += n;
  w.in_flight_requests = m.in_flight_requests();
  w.pending_items = m.pending_items();
  w.pending_tokens = m.pending_tokens();
  w.l1_evictions = m.l1_evictions();
  w.l2_evictions = m.l2_evictions();
  w.demotions = m.demotions();
  w.promotions = m.promotions();
  w.l1_used_bytes = m.l1_used_bytes();
  w.l2_used_bytes = m.l2_used_bytes();
  w.l1_entries = m.l1_entries();
  w.l2_entries = m.l2_entries();
  s.l1_capacity_bytes = m.l1_capacity_bytes();
  s.l2_capacity_bytes = m.l2_capacity_bytes();
  for (const auto& [name, n] : m.rpc_errors()) s.rpc_errors[CodeFromName(name)] += n;
  s.buffered_bytes = m.buffered_bytes();
  s.shm.capacity_bytes = m.shm_capacity_bytes();
  s.shm.leased_bytes = m.shm_leased_bytes();
  s.shm.leases = m.shm_leases();
  s.shm.items = m.shm_items();
  s.shm.fallbacks = m.shm_fallbacks();
  s.shm.released = m.shm_released();
  s.shm.expired = m.shm_expired();
  s.shm.refused_releases = m.shm_refused_releases();
  s.shm.reused = m.shm_reused();
  s.shm.evicted = m.shm_evicted();
  s.ipc.capacity_bytes = m.ipc_capacity_bytes();
  s.ipc.exported_bytes = m.ipc_exported_bytes();
  s.ipc.leases = m.ipc_leases();
  s.ipc.exports = m.ipc_exports();
  s.ipc.items = m.ipc_items();
  s.ipc.reused = m.ipc_reused();
  s.ipc.fallbacks = m.ipc_fallbacks();
  s.ipc.not_resident = m.ipc_not_resident();
  s.ipc.released = m.ipc_released();
  s.ipc.expired = m.ipc_expired();
  s.ipc.refused_releases = m.ipc_refused_releases();
  s.ipc.session_reclaimed = m.ipc_session_reclaimed();
  s.shm.sessions = m.shm_sessions();
  s.shm.sessions_opened = m.shm_sessions_opened();
  s.shm.sessions_refused = m.shm_sessions_refused();
  s.shm.session_reclaimed = m.shm_session_reclaimed();
  s.shm.session_unknown = m.shm_session_unknown();
  w.hits_l3 = m.hits_l3();
  s.l3_enabled = m.l3_enabled();
  s.l3.degraded = m.l3_degraded();
  for (const auto& [name, field] : L3CounterFields()) {
    if (auto it = m.l3_counters().find(name); it != m.l3_counters().end()) s.l3.*field = it->second;
  }
  for (const auto& [kind, n] : m.l3_errors()) s.l3.errors[kind] = n;
  w.video_items = m.video_items();
  w.video_decodes = m.video_decodes();
  w.chunk_hits = m.chunk_hits();
  w.chunk_misses = m.chunk_misses();
  w.chunk_joins = m.chunk_joins();
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
