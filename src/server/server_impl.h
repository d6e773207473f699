// src/server/server_impl.h (internal): EncodeServer::Impl, the state of one
// server, shared by server.cc (start, shutdown), server_impl.cc (the sync
// methods, Session, the counters) and encode_call.cc (the Encode method).
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
#include "epd/server/request_shape.h"
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

// The per-tenant counters as the Stats RPC reports them.
void ToProto(const TenantCounters& c, v1::TenantStats* out);

// ServerOptions::miss_reply_floor's rule, for the Encode RPC (per item) and
// the front door (per reply): the floor is on and `r` is a miss that
// succeeded. Hits, joins and failures are never held.
bool HeldByMissFloor(const ServerOptions& o, const ItemResult& r);

// The shape of an Encode call's request for CheckRequestShape
// (epd/server/request_shape.h); `message_bytes` is its size on the wire.
RequestShape ShapeOf(const v1::EncodeRequest& req, std::int64_t message_bytes);

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

  // The server's counters (Stats, the metrics page). Thread-safe.
  ServerStats Snapshot() const;

  // The lease session an Encode call names in "x-epd-session", if any
  // (shm_session.h): its owner in each lease store, all 0 for no header, a
  // session not open here, a call that makes no leases (`leases` false), or
  // a server without sessions. kInvalidArgument for a malformed header.
  StatusOr<internal::LeaseOwners> SessionOwners(const grpc::ServerContextBase& ctx, bool leases);

  // The methods (server_impl.cc; Encode in encode_call.cc).
  grpc::ServerWriteReactor<v1::EncodedItem>* Encode(grpc::CallbackServerContext* ctx,
                                                    const v1::EncodeRequest* req) override;

  // probe_call.cc
  grpc::Status Probe(grpc::ServerContext* ctx, const v1::EncodeRequest* req, v1::ProbeResponse* out) override;
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*, v1::HealthResponse* out) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req, v1::ReleaseResponse* out) override;
  grpc::ServerBidiReactor<v1::SessionMessage, v1::SessionEvent>* Session(grpc::CallbackServerContext* ctx) override;
  // Global counters for an operator (or a server without credentials);
  // a tenant credential gets its own tenant's counters only (tenants.h).
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*, v1::StatsResponse* out) override;
};

}  // namespace epd
