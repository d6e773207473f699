// EncodeServer::Impl's methods other than Encode (encode_call.cc): the sync
// methods (Health, Release, Stats), the Session reactor's start, the
// counters' snapshot, and the helpers server_impl.h declares.
#include "server_impl.h"

#include <optional>
#include <string>

#include "epd/core/version.h"

namespace epd {
namespace internal {

void ToProto(const TenantCounters& c, v1::TenantStats* out) {
  out->set_requests(c.requests);
  out->set_items(c.items);
  out->set_hits_l1(c.hits_l1);
  out->set_hits_l2(c.hits_l2);
  out->set_hits_l3(c.hits_l3);
  out->set_misses(c.misses);
  out->set_joins(c.joins);
  out->set_refusals(c.refusals);
  out->set_failed_items(c.failed_items);
}

bool HeldByMissFloor(const ServerOptions& o, const ItemResult& r) {
  return o.miss_reply_floor.count() > 0 && r.source == ItemSource::kMiss && r.status.ok();
}

RequestShape ShapeOf(const v1::EncodeRequest& req, std::int64_t message_bytes) {
  RequestShape shape;
  shape.id = req.id();
  shape.message_bytes = message_bytes;
  shape.items.reserve(static_cast<std::size_t>(req.items_size()));
  for (const v1::EncodeItem& item : req.items()) {
    shape.items.push_back(ItemShape{.image = !item.image().empty(),
                                    .caller_key = !item.caller_key().empty(),
                                    .video = !item.video().empty(),
                                    .video_frames = item.has_video_frames(),
                                    .frame_count = item.video_frames().frames_size()});
  }
  return shape;
}

}  // namespace internal

ServerStats EncodeServer::Impl::Snapshot() const {
  ServerStats s;
  s.server_id = options.server_id;
  if (loop != nullptr) {
    s.worker = loop->Stats();
    s.l3_enabled = loop->has_shared_tier();
    s.l3 = loop->SharedTierStatsSnapshot();
  }
  s.l1_capacity_bytes = worker_options.l1_capacity_bytes;
  s.l2_capacity_bytes = worker_options.l2_capacity_bytes;
  s.rpc_errors = outcomes->Errors();
  if (replies != nullptr) {
    const internal::ReplyBudget::Stats r = replies->Snapshot();
    s.buffered_bytes = r.buffered_bytes;
    s.reply_held_bytes = r.held_bytes;
    s.reply_refusals = r.refusals;
    s.throttled_calls = r.throttled_calls;
    s.write_timeouts = r.write_timeouts;
  }
  if (budget != nullptr) {
    s.request_bytes_in_flight = budget->in_flight();
    s.admission_waiting = budget->waiting();
  }
  if (arena != nullptr) s.shm = arena->Stats();
  if (ipc != nullptr) s.ipc = ipc->Stats();
  if (sessions != nullptr) sessions->AddStats(&s.shm);
  return s;
}

StatusOr<internal::LeaseOwners> EncodeServer::Impl::SessionOwners(const grpc::ServerContextBase& ctx, bool leases) {
  if (!leases || sessions == nullptr) return internal::LeaseOwners{};
  return sessions->OwnerFor(ctx.client_metadata());
}

grpc::Status EncodeServer::Impl::Health(grpc::ServerContext* ctx, const v1::HealthRequest*, v1::HealthResponse* out) {
  if (Status s = auth->Check(*ctx); !s.ok()) return internal::ToGrpc(s);
  out->set_serving(serving.load());
  out->set_server_id(options.server_id);
  out->set_model_id(worker_options.model_id);
  internal::ToProto(worker_options.preprocess, out->mutable_preprocess());
  out->set_key_mode(std::string(KeyModeName(worker_options.key_mode)));
  out->set_tower(tower_description);
  out->set_hidden(tower_hidden);
  out->set_deepstack_layers(tower_deepstack);
  out->set_dtype(internal::ToProto(tower_dtype));
  out->set_version(std::string(kVersion));
  out->set_l3(!loop->has_shared_tier() ? "off" : loop->SharedTierStatsSnapshot().degraded ? "degraded" : "ok");
  return grpc::Status::OK;
}

grpc::Status EncodeServer::Impl::Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                                         v1::ReleaseResponse* out) {
  if (Status s = auth->Check(*ctx); !s.ok()) return internal::ToGrpc(s);
  Status refusal;
  out->set_released(internal::ReleaseAnyLeases(arena.get(), ipc.get(), req->leases(), &refusal));
  if (!refusal.ok() && req->leases_size() > 1) {
    refusal = Status(refusal.code(), refusal.message() + " (" + std::to_string(out->released()) + " of " +
                                         std::to_string(req->leases_size()) + " leases were released)");
  }
  return internal::ToGrpc(refusal);
}

grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>* EncodeServer::Impl::Session(
    grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto bearer = md.find("authorization");
  Status admission = auth->CheckHeader(
      bearer == md.end() ? std::nullopt
                         : std::optional<std::string>(std::string(bearer->second.data(), bearer->second.size())));
  if (admission.ok() && sessions == nullptr) {
    admission = Status(StatusCode::kFailedPrecondition,
                       "this server has no shared-memory arena (start it with --shm-arena-mb); a lease session "
                       "would hold nothing");
  }
  if (admission.ok() && !serving.load()) admission = Status(StatusCode::kUnavailable, "the server is shutting down");
  return internal::StartSessionReactor(sessions.get(), std::move(admission));
}

grpc::Status EncodeServer::Impl::Stats(grpc::ServerContext* ctx, const v1::StatsRequest*, v1::StatsResponse* out) {
  StatusOr<internal::Caller> caller = tenants->Identify(*ctx);
  if (!caller.ok()) return internal::ToGrpc(caller.status());
  if (caller->is_operator) {
    internal::ToProto(Snapshot(), out);
  } else {
    out->set_server_id(options.server_id);
  }
  out->set_scope(caller->is_operator ? "global" : "tenant");
  out->set_tenant(caller->tenant);
  internal::ToProto(tenant_stats->Of(caller->tenant), out->mutable_tenant_stats());
  return grpc::Status::OK;
}

}  // namespace epd
