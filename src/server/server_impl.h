// src/server/server_impl.h (internal): EncodeServer::Impl, the state of one
// server, shared by server.cc (start, shutdown, the sync methods) and
// encode_call.cc (the Encode method).
//
// Thread safety: the members are set by EncodeServer::Start before the
// server accepts calls and not reassigned after; each one's own thread
// safety applies (the atomics, and objects documented thread-safe).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "admission.h"
#include "auth.h"
#include "call_outcomes.h"
#include "epd/core/version.h"
#include "epd/server/server.h"
#include "epd/v1/encoder.grpc.pb.h"
#include "epd/worker/worker_loop.h"
#include "ipc_delivery.h"
#include "ipc_leases.h"
#include "metrics.h"
#include "proto_convert.h"
#include "reply_budget.h"
#include "shm_arena.h"
#include "shm_session.h"
#include "task_pool.h"
#include "tenant_stats.h"
#include "tenants.h"

namespace epd {
namespace internal {

inline void ToProto(const TenantCounters& c, v1::TenantStats* out) {
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

// ServerOptions::miss_reply_floor's rule, for the Encode RPC (per item) and
// the front door (per reply): the floor is on and `r` is a miss that
// succeeded. Hits, joins and failures are never held.
inline bool HeldByMissFloor(const ServerOptions& o, const ItemResult& r) {
  return o.miss_reply_floor.count() > 0 && r.source == ItemSource::kMiss && r.status.ok();
}

}  // namespace internal

// The service. Encode (encode_call.h) and Session (shm_session.h) use the
// callback API; Health, Stats and Release, which never wait, are sync.
struct EncodeServer::Impl final
    : public v1::Encoder::WithCallbackMethod_Encode<v1::Encoder::WithCallbackMethod_Session<v1::Encoder::Service>> {
  ServerOptions options;
  WorkerOptions worker_options;  // as passed to the worker, sink_full included
  std::string tower_description;
  std::int64_t tower_hidden = 0, tower_deepstack = 0;
  DType tower_dtype = DType::kFloat32;

  std::shared_ptr<internal::ServerMetrics> metrics;
  std::unique_ptr<WorkerLoop> loop;
  std::unique_ptr<internal::TenantDirectory> tenants;   // who calls, and their key namespace (tenants.h)
  const internal::TokenCheck* auth = nullptr;           // tenants' token table
  std::shared_ptr<internal::TenantStats> tenant_stats;  // shared with the metrics page's source
  std::unique_ptr<internal::RequestBudget> budget;
  std::unique_ptr<internal::ReplyBudget> replies;    // what unsent replies hold (reply_budget.h)
  std::unique_ptr<internal::CallOutcomes> outcomes;  // outlives `server`, whose interceptor uses it
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<internal::ShmArena> arena;        // null = no shared-memory delivery
  std::unique_ptr<internal::IpcLeases> ipc;         // null = no CUDA IPC delivery
  std::string ipc_device_name;                      // ipc's Device::Describe(), sent in every CudaIpcRef
  std::unique_ptr<internal::ShmSessions> sessions;  // lease sessions over `arena` and `ipc`; null without both
  std::unique_ptr<internal::TaskPool> pool;         // inline replies (EncodeCall), admission deadlines (budget)
  int port = 0;

  std::atomic<bool> serving{false};
  std::atomic<std::uint64_t> next_auto_id{1};
  std::mutex shutdown_mu;
  bool shut_down = false;  // guarded by shutdown_mu

  ServerStats Snapshot() const {
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

  // Request-level checks that need no worker state (see server.h, step 1).
  Status Validate(const v1::EncodeRequest& req) const {
    if (req.items_size() == 0) return InvalidArgument("the request has no items; send at least one image");
    if (req.items_size() > options.max_items_per_request) {
      return InvalidArgument("the request has " + std::to_string(req.items_size()) +
                             " items; this server accepts at most " + std::to_string(options.max_items_per_request) +
                             " per request (split it, or raise --max-items-per-request)");
    }
    for (int i = 0; i < req.items_size(); ++i) {
      const v1::EncodeItem& item = req.items(i);
      const std::string at = "item " + std::to_string(i);
      const bool is_video = !item.video().empty() || item.has_video_frames();
      if (is_video) {
        if (!item.image().empty() || !item.caller_key().empty() || (!item.video().empty() && item.has_video_frames())) {
          return InvalidArgument(at +
                                 " mixes kinds: a video item sets exactly one of `video` and `video_frames`, "
                                 "and neither `image` nor `caller_key`");
        }
        if (item.has_video_frames() && item.video_frames().frames_size() == 0) {
          return InvalidArgument(at + " has `video_frames` without frames");
        }
      } else if (item.image().empty() && item.caller_key().empty()) {
        return InvalidArgument(at +
                               " is empty: set `image` to JPEG or PNG bytes, `caller_key` to a key "
                               "this server has cached, or `video` / `video_frames`");
      }
    }
    return Status::Ok();
  }

  // The lease session an Encode call names in "x-epd-session", if any
  // (shm_session.h): its owner in each lease store, all 0 for no header, a
  // session not open here, a call that makes no leases (`leases` false), or
  // a server without sessions. kInvalidArgument for a malformed header.
  StatusOr<internal::LeaseOwners> SessionOwners(const grpc::ServerContextBase& ctx, bool leases) {
    if (!leases || sessions == nullptr) return internal::LeaseOwners{};
    return sessions->OwnerFor(ctx.client_metadata());
  }

  grpc::ServerWriteReactor<v1::EncodedItem>* Encode(grpc::CallbackServerContext* ctx,
                                                    const v1::EncodeRequest* req) override;

  // probe_call.cc
  grpc::Status Probe(grpc::ServerContext* ctx, const v1::EncodeRequest* req, v1::ProbeResponse* out) override;

  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*, v1::HealthResponse* out) override {
    if (Status s = auth->Check(*ctx); !s.ok()) return internal::ToGrpc(s);
    out->set_serving(serving.load());
    out->set_server_id(options.server_id);
    out->set_model_id(worker_options.model_id);
    internal::ToProto(worker_options.preprocess, out->mutable_preprocess());
    out->set_key_mode(worker_options.key_mode == KeyMode::kSha256 ? "sha256" : "xxh3-fast");
    out->set_tower(tower_description);
    out->set_hidden(tower_hidden);
    out->set_deepstack_layers(tower_deepstack);
    out->set_dtype(internal::ToProto(tower_dtype));
    out->set_version(std::string(kVersion));
    out->set_l3(!loop->has_shared_tier() ? "off" : loop->SharedTierStatsSnapshot().degraded ? "degraded" : "ok");
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req, v1::ReleaseResponse* out) override {
    if (Status s = auth->Check(*ctx); !s.ok()) return internal::ToGrpc(s);
    Status refusal;
    out->set_released(internal::ReleaseAnyLeases(arena.get(), ipc.get(), req->leases(), &refusal));
    if (!refusal.ok() && req->leases_size() > 1) {
      refusal = Status(refusal.code(), refusal.message() + " (" + std::to_string(out->released()) + " of " +
                                           std::to_string(req->leases_size()) + " leases were released)");
    }
    return internal::ToGrpc(refusal);
  }

  grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>* Session(grpc::CallbackServerContext* ctx) override {
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

  // Global counters for an operator (or a server without credentials);
  // a tenant credential gets its own tenant's counters only (tenants.h).
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*, v1::StatsResponse* out) override {
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
};

}  // namespace epd
