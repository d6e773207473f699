// EncodeServer: gRPC over a WorkerLoop. Encode (encode_call.h) and Session
// (shm_session.h) use gRPC's callback API; Health, Stats and Release, which
// do no waiting, are sync. This file starts and stops the server: Start
// validates its options (ServerOptions::Validate), then runs one named step
// per part (identity and metrics, delivery, budgets, worker, gRPC, the
// metrics page). The methods' bodies are in server_impl.cc and
// encode_call.cc.
//
// Threads: gRPC's own (they receive calls and run the callback reactions),
// the sync methods' handler threads, the WorkerLoop thread, a small TaskPool
// (inline replies, admission deadlines) and the metrics endpoint's
// (epd::HttpEndpoint: an accept thread, an epoll thread, two servers).
#include "epd/server/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "server_impl.h"
#include "standard_services.h"
#include "tls.h"

namespace epd {
namespace {

// Idle gRPC handler threads kept waiting for calls of the sync methods (see
// SetThreadsAndQuota).
constexpr int kIdleRpcThreads = 16;
// What gRPC's memory quota gets beyond twice the request budget: room for
// the transport's read buffers, which gRPC grows up to 4 MiB a connection
// (PosixTcpOptions::kDefaultMaxReadChunksize in gRPC's tcp_posix). Without
// it a small budget's quota (3 MiB for a budget of one 1.5 MiB request) was
// used up by a few uploads at once, and gRPC reset the admitted call as well
// (EncodeCallTest.ABudgetOfOneRequestQueuesABurstAndServesItOneAtATime).
constexpr std::int64_t kQuotaSlackBytes = std::int64_t{32} << 20;
// How long after the held reply bytes fall to 0 the drained hook (malloc_trim)
// runs; see where the reply budget is made.
constexpr std::chrono::milliseconds kTrimDelay{250};
// A duration as a gRPC channel argument (an int of ms).
int ClampMs(std::chrono::milliseconds d) {
  return static_cast<int>(std::min<std::int64_t>(d.count(), std::numeric_limits<int>::max()));
}

// Threads that build inline replies and run admission deadlines (task_pool.h).
int PoolThreads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u)); }

// The host part of a "host:port" address ("[::1]:80" -> "::1"); 127.0.0.1
// for a Unix socket: where the metrics endpoint listens by default.
std::string HostOf(const std::string& address) {
  if (address.starts_with("unix:")) return "127.0.0.1";
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// Start's steps, in order. Each fills its part of `self`; a step that fails
// leaves what earlier steps started for the caller to stop.

// The options, the tower and the TLS credentials they name.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ValidateStart(const ServerOptions& options,
                                                                 const VisionTower* tower) {
  if (Status s = options.Validate(); !s.ok()) return s;
  if (tower == nullptr) return InvalidArgument("tower is null");
  return internal::MakeServerCredentials(options.tls_cert_pem, options.tls_key_pem, options.tls_client_ca_pem);
}

// Who calls (tenants, tokens), what failed calls log, and the metrics page's
// sources; the tower's shape as Health reports it.
Status MakeIdentityAndMetrics(EncodeServer::Impl* self, const VisionTower& tower) {
  const ServerOptions& options = self->options;
  self->tower_description = tower.Describe();
  self->tower_hidden = tower.hidden();
  self->tower_deepstack = tower.deepstack_layers();
  self->tower_dtype = tower.dtype();
  self->outcomes = std::make_unique<internal::CallOutcomes>(options.log);
  StatusOr<std::unique_ptr<internal::TenantDirectory>> tenants = internal::TenantDirectory::Create(options);
  if (!tenants.ok()) return tenants.status();
  self->tenants = std::move(*tenants);
  self->auth = &self->tenants->tokens();
  // Failed calls are logged with their tenant (an unknown token's as "?")
  // where something names tenants.
  self->outcomes->SetTenantOf([tenants = self->tenants.get()](const grpc::ServerContextBase& ctx) {
    if (!tenants->names_tenants()) return std::string();
    StatusOr<internal::Caller> c = tenants->Identify(ctx);
    return c.ok() ? c->tenant : std::string("?");
  });
  self->tenant_stats = std::make_shared<internal::TenantStats>(options.max_tenant_labels, self->tenants->configured());
  // The cache families name a tenant by its quota share, "tenant:<name>"
  // for a credential's tenant: the tokens file's tenants are ranked first.
  std::set<std::string> shares;
  for (const std::string& t : self->tenants->configured()) shares.insert("tenant:" + t);
  self->metrics = std::make_shared<internal::ServerMetrics>(
      [self] { return self->Snapshot(); }, std::make_shared<internal::TenantLabels>(options.max_tenant_labels, shares));
  self->metrics->AddSource([stats = self->tenant_stats] { return stats->Render(); });
  return Status::Ok();
}

// Zero-copy delivery: the shared-memory arena, CUDA IPC exports and the
// lease sessions over them (docs/SHM.md).
Status StartDelivery(EncodeServer::Impl* self) {
  const ServerOptions& options = self->options;
  if (options.shm_arena_bytes > 0) {
    StatusOr<std::unique_ptr<internal::ShmArena>> arena =
        internal::ShmArena::Create(options.shm_arena_bytes, options.shm_lease);
    if (!arena.ok()) return arena.status();
    self->arena = std::move(*arena);
  }
  if (options.ipc_device != nullptr && options.ipc_export_bytes > 0) {
    StatusOr<std::unique_ptr<internal::IpcLeases>> ipc =
        internal::IpcLeases::Create(options.ipc_device, options.ipc_export_bytes,
                                    options.ipc_lease.count() > 0 ? options.ipc_lease : options.shm_lease);
    if (!ipc.ok()) return ipc.status();
    self->ipc = std::move(*ipc);
    self->ipc_device_name = options.ipc_device->Describe();
  }
  if (self->arena != nullptr || self->ipc != nullptr) {
    self->sessions =
        std::make_unique<internal::ShmSessions>(self->arena.get(), self->ipc.get(), options.shm_max_sessions);
  }
  return Status::Ok();
}

// The task pool, the in-flight request budget and the reply budget, whose
// sink_full the worker consults before each tower batch (server.h,
// "Backpressure").
void MakeBudgets(EncodeServer::Impl* self, WorkerOptions& worker_options) {
  const ServerOptions& options = self->options;
  self->pool = std::make_unique<internal::TaskPool>(PoolThreads());
  self->budget = std::make_unique<internal::RequestBudget>(options.max_inflight_request_bytes,
                                                           options.max_inflight_request_bytes / 16,
                                                           options.on_requests_drained, self->pool.get());
  internal::ReplyBudget::Limits reply_limits;
  reply_limits.buffered_bytes = options.max_buffered_bytes;
  reply_limits.tenant_share_bytes = options.max_buffered_bytes_per_tenant > 0
                                        ? options.max_buffered_bytes_per_tenant
                                        : std::max<std::int64_t>(1, options.max_buffered_bytes / 4);
  reply_limits.held_bytes = options.max_reply_bytes;
  reply_limits.connection_held_bytes = options.max_reply_bytes_per_connection;
  reply_limits.burst_bytes = options.max_reply_bytes / 16;
  // The drained hook waits kTrimDelay: gRPC frees a finished stream's
  // buffers (the serialized replies among them) after the call's OnDone,
  // where the last bytes are given back, so a trim at once would find most
  // of them still allocated (measured: 37 MB of 98 MB held stayed resident).
  std::function<void()> replies_drained;
  if (options.on_requests_drained) {
    replies_drained = [self, hook = options.on_requests_drained] {
      self->pool->PostAt(std::chrono::steady_clock::now() + kTrimDelay, [self, hook] {
        if (self->replies->Snapshot().held_bytes == 0) hook();
      });
    };
  }
  // Calls exist only once the server runs, and the loop is set before it
  // does: on_room never sees a null loop.
  self->replies = std::make_unique<internal::ReplyBudget>(
      reply_limits, [self] { self->loop->Wake(); }, std::move(replies_drained));
  std::function<bool()> user_sink_full = std::move(worker_options.sink_full);
  worker_options.sink_full = [self, user_sink_full] {
    return self->replies->SinkFull() || (user_sink_full && user_sink_full());
  };
}

// The worker over the metered tower, and the loop that owns it.
Status StartWorker(EncodeServer::Impl* self, WorkerOptions worker_options, std::unique_ptr<VisionTower> tower) {
  self->worker_options = worker_options;
  StatusOr<std::unique_ptr<EncodeWorker>> worker =
      EncodeWorker::Create(std::move(worker_options), internal::MeterTower(std::move(tower), self->metrics));
  if (!worker.ok()) return worker.status();
  self->loop = std::make_unique<WorkerLoop>(std::move(*worker));
  return Status::Ok();
}

// The channel arguments that come from ServerOptions: keepalive, streams
// per connection, message sizes.
void SetChannelArguments(grpc::ServerBuilder& builder, const ServerOptions& options) {
  // gRPC sets SO_REUSEPORT by default, so a second server on a busy port would
  // start and silently share its traffic; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive (ServerOptions::keepalive). An idle lease session sends no
  // data for minutes; gRPC 1.51 keeps pinging it all the same (the
  // vanished-host test in tests/python/test_shm.py idles through six pings).
  if (options.keepalive.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ClampMs(options.keepalive));
  }
  if (options.keepalive_timeout.count() > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ClampMs(options.keepalive_timeout));
  }
  // Streams a connection may open at once (ServerOptions::max_concurrent_streams).
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  }
  // gRPC refuses a message over its limit before any code of ours (the
  // interceptor included) sees the call, so such refusals could be neither
  // counted nor logged. Its limit is therefore a backstop at twice ours, and
  // Encode enforces max_request_bytes itself.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<std::int64_t>(2 * options.max_request_bytes, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(-1);
}

// The sync methods' handler threads and gRPC's memory quota.
void SetThreadsAndQuota(grpc::ServerBuilder& builder, grpc::ResourceQuota& quota, const ServerOptions& options) {
  // The sync methods' idle handler threads wait for calls in slices of this
  // length (10 s by default), and gRPC's Shutdown joins them; a short slice
  // keeps any wait on an idle poller short, for the cost of five wake-ups a
  // second per idle poller. (The 10-13 s exits of issue 15 were not reproduced here; the
  // CLI's ExitDeadline bounds the exit whatever their cause.)
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 200);
  // gRPC's sync server turns a polling thread into a handler when a call
  // arrives, starts a new poller if too few are left, and ends a handler
  // thread that finds more than MAX_POLLERS (2 by default) polling when its
  // call is done. With more than two calls at a time that means a thread
  // created and destroyed per call (pthread_create, TLS set-up, stack
  // unmapping with its TLB shootdown), measured here as several percent of
  // a hit's CPU. Up to kIdleRpcThreads idle threads are kept instead.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, kIdleRpcThreads);
  quota.SetMaxThreads(options.max_rpc_threads);
  // The transport's buffers (requests being received among them) are
  // charged to this quota; past it gRPC shrinks its flow-control windows
  // and, under severe pressure, resets streams (ENHANCE_YOUR_CALM),
  // admitted calls included. Twice the request budget, so that the
  // budget (counted, logged, with a clear message) is what a burst normally
  // meets and the quota only backs it up, plus kQuotaSlackBytes for the
  // buffers that are not requests (see there). A request parsed and waiting
  // for admission is no longer charged (six 1.2 MiB waiters over a 6 MiB
  // quota were not reset); admission_wait bounds how long it is held.
  quota.Resize(static_cast<std::size_t>(2 * options.max_inflight_request_bytes + kQuotaSlackBytes));
  builder.SetResourceQuota(quota);
}

// Binds every address and starts gRPC; kUnavailable naming the first
// address that could not be bound.
Status StartGrpcServer(EncodeServer::Impl* self, const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  const ServerOptions& options = self->options;
  internal::EnableStandardServices();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, credentials, &self->port);
  std::vector<int> extra_ports(options.extra_addresses.size(), 0);
  for (std::size_t i = 0; i < options.extra_addresses.size(); ++i) {
    builder.AddListeningPort(options.extra_addresses[i], credentials, &extra_ports[i]);
  }
  SetChannelArguments(builder, options);
  builder.RegisterService(self);
  grpc::ResourceQuota quota("epd-encode-server");
  SetThreadsAndQuota(builder, quota, options);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(self->outcomes->MakeInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  self->server = builder.BuildAndStart();
  // gRPC reports a bound Unix socket as a non-zero "port" too; 0 = not bound.
  std::string unbound;
  if (self->port == 0) unbound = options.address;
  for (std::size_t i = 0; i < extra_ports.size(); ++i) {
    if (extra_ports[i] == 0 && unbound.empty()) unbound = options.extra_addresses[i];
  }
  if (self->server == nullptr || !unbound.empty()) {
    if (self->server != nullptr) self->server->Shutdown(std::chrono::system_clock::now());
    return Status(StatusCode::kUnavailable, "cannot listen on " + (unbound.empty() ? options.address : unbound) +
                                                " (address in use, not a local address, or a socket path that "
                                                "exists already?)");
  }
  if (options.address.starts_with("unix:")) self->port = 0;
  if (self->options.server_id.empty()) {
    self->options.server_id =
        HostName() + ":" + (options.address.starts_with("unix:") ? options.address : std::to_string(self->port));
  }
  return Status::Ok();
}

// The Prometheus page, when asked for (metrics_port >= 0).
Status StartMetrics(EncodeServer::Impl* self) {
  const ServerOptions& options = self->options;
  if (options.metrics_port < 0) return Status::Ok();
  internal::MetricsEndpointOptions mo;
  mo.host = options.metrics_address.empty() ? HostOf(options.address) : options.metrics_address;
  mo.port = options.metrics_port;
  if (self->auth->enabled()) {
    // The page is global (every tenant's label): an operator's token only.
    mo.authorize = [self](const std::optional<std::string>& h) -> Status {
      StatusOr<internal::TokenOwner> owner = self->auth->Owner(h);
      if (!owner.ok()) return owner.status();
      if (!owner->is_operator) {
        return Status(StatusCode::kPermissionDenied, "the metrics page is an operator's; this token is a tenant's");
      }
      return Status::Ok();
    };
  }
  return self->metrics->Serve(mo);
}

}  // namespace

EncodeServer::EncodeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeServer::~EncodeServer() { Shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<EncodeServer>> EncodeServer::Start(ServerOptions options, WorkerOptions worker_options,
                                                            std::unique_ptr<VisionTower> tower) {
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = ValidateStart(options, tower.get());
  if (!credentials.ok()) return credentials.status();
  auto impl = std::make_unique<Impl>();
  Impl* self = impl.get();
  self->options = std::move(options);
  if (Status s = MakeIdentityAndMetrics(self, *tower); !s.ok()) return s;
  if (Status s = StartDelivery(self); !s.ok()) return s;
  MakeBudgets(self, worker_options);
  if (Status s = StartWorker(self, std::move(worker_options), std::move(tower)); !s.ok()) return s;
  if (Status s = StartGrpcServer(self, *credentials); !s.ok()) {
    self->loop->Shutdown(std::chrono::milliseconds(0));
    return s;
  }
  if (Status s = StartMetrics(self); !s.ok()) {
    self->server->Shutdown(std::chrono::system_clock::now());
    self->loop->Shutdown(std::chrono::milliseconds(0));
    return s;
  }
  self->serving = true;
  internal::SetStandardHealth(*self->server, true);
  return std::unique_ptr<EncodeServer>(new EncodeServer(std::move(impl)));
}

int EncodeServer::port() const { return impl_->port; }
int EncodeServer::metrics_port() const { return impl_->metrics->port(); }
const std::string& EncodeServer::server_id() const { return impl_->options.server_id; }
ServerStats EncodeServer::Stats() const { return impl_->Snapshot(); }

void EncodeServer::Shutdown(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mu);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  impl_->serving = false;
  internal::SetStandardHealth(*impl_->server, false);
  // Lease sessions stay open for their clients' lifetimes: end them now
  // (releasing their leases) rather than have them hold the grace period.
  if (impl_->sessions != nullptr) {
    impl_->sessions->EndAll(Status(StatusCode::kUnavailable, "the server is shutting down"));
  }
  // Refuses new calls at once; waits for handlers until the deadline, then
  // cancels the calls still running (their handlers notice and return).
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
  // Every call has finished: nothing of theirs is left on the pool.
  impl_->pool->Shutdown();
  impl_->metrics->Stop();
  impl_->loop->Shutdown(std::chrono::milliseconds(0));
}

}  // namespace epd
