// EncodeServer: the sync gRPC API over a WorkerLoop.
//
// Threads: gRPC's handler threads (one per in-flight call), the WorkerLoop
// thread, and the metrics exposer's thread. The worker thread never touches
// gRPC: its callbacks push an ItemResult (a shared pointer, no copy) onto the
// call's CallState and signal the handler, which copies the embedding into a
// message and writes it. So a slow client blocks only its own handler in
// Write; what it leaves queued is counted in buffered_bytes, and the worker's
// sink_full() stops starting tower batches while that passes the limit.
//
// Why the sync API rather than the callback API: the callback API would run
// StartWrite, and with it the message copy and serialisation, on whichever
// thread delivers the item, i.e. the worker thread, unless a second hand-off
// moved it elsewhere. A handler thread per call gives that hand-off for free,
// and the cost (a thread per in-flight call, bounded by max_rpc_threads) is
// small next to an encode. The price is that a client's cancellation is only
// noticed on the handler's next poll (cancel_poll); deadlines are exact.
//
// A call that gives up (deadline, cancellation, failed write) marks its
// CallState abandoned and cancels the request in the worker; items the
// worker delivers in between are dropped without being buffered.
#include "epd/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <utility>

#include "epd/preprocess.h"
#include "epd/v1/encoder.grpc.pb.h"
#include "epd/version.h"
#include "epd/worker_loop.h"
#include "admission.h"
#include "auth.h"
#include "call_outcomes.h"
#include "ipc_delivery.h"
#include "ipc_leases.h"
#include "metrics.h"
#include "proto_convert.h"
#include "request_id.h"
#include "shm_arena.h"
#include "shm_delivery.h"
#include "shm_session.h"
#include "standard_services.h"
#include "tls.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

// Idle gRPC handler threads kept waiting for calls (see BuildAndStart).
constexpr int kIdleRpcThreads = 16;

// What a handler and the worker's callbacks share for one call.
struct CallState {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ItemResult> ready;  // delivered, not yet written
  bool done = false;             // on_done fired
  Status request_status;         // RequestResult::status, valid once done
  bool abandoned = false;        // the handler left; drop further deliveries
};

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::int64_t ResultBytes(const ItemResult& r) {
  return r.embedding != nullptr ? static_cast<std::int64_t>(r.embedding->nbytes()) : 0;
}

}  // namespace

// Session (lease sessions, shm_session.h) uses the callback API; every
// other method is sync.
struct EncodeServer::Impl final : public v1::Encoder::WithCallbackMethod_Session<v1::Encoder::Service> {
  ServerOptions options;
  WorkerOptions worker_options;  // as passed to the worker, sink_full included
  std::string tower_description;
  std::int64_t tower_hidden = 0, tower_deepstack = 0;
  DType tower_dtype = DType::kFloat32;

  std::shared_ptr<internal::ServerMetrics> metrics;
  std::unique_ptr<WorkerLoop> loop;
  std::unique_ptr<internal::TokenCheck> auth;
  std::unique_ptr<internal::RequestBudget> budget;
  std::unique_ptr<internal::CallOutcomes> outcomes;  // outlives `server`, whose interceptor uses it
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<internal::ShmArena> arena;  // null = no shared-memory delivery
  std::unique_ptr<internal::IpcLeases> ipc;   // null = no CUDA IPC delivery
  std::string ipc_device_name;                // ipc's Device::Describe(), sent in every CudaIpcRef
  std::unique_ptr<internal::ShmSessions> sessions;  // lease sessions over `arena` and `ipc`; null without both
  int port = 0;

  std::atomic<bool> serving{false};
  std::atomic<std::int64_t> buffered_bytes{0};
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
    s.buffered_bytes = buffered_bytes.load();
    if (arena != nullptr) s.shm = arena->Stats();
    if (ipc != nullptr) s.ipc = ipc->Stats();
    if (sessions != nullptr) sessions->AddStats(&s.shm);
    return s;
  }

  void Unbuffer(std::int64_t bytes) {
    if (bytes == 0) return;
    const std::int64_t before = buffered_bytes.fetch_sub(bytes);
    // Crossing back under the limit: let the worker start batches again now
    // rather than at its next 1 ms poll.
    if (before > options.max_buffered_bytes && before - bytes <= options.max_buffered_bytes) loop->Wake();
  }

  grpc::Status Finish(const Status& s, Clock::time_point start) {
    metrics->ObserveCall(std::chrono::duration<double>(Clock::now() - start).count());
    return internal::ToGrpc(s);  // counted and logged by `outcomes`' interceptor
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

  grpc::Status Encode(grpc::ServerContext* ctx, const v1::EncodeRequest* req,
                      grpc::ServerWriter<v1::EncodedItem>* writer) override {
    const Clock::time_point start = Clock::now();
    if (Status s = auth->Check(*ctx); !s.ok()) return Finish(s, start);
    if (const std::size_t bytes = req->ByteSizeLong(); bytes > static_cast<std::size_t>(options.max_request_bytes)) {
      return Finish(ResourceExhausted("the request is " + std::to_string(bytes) + " bytes; this server accepts at most " +
                                      std::to_string(options.max_request_bytes) +
                                      " (split it, or raise --max-request-mb)"),
                    start);
    }
    if (!serving.load()) return Finish(Status(StatusCode::kUnavailable, "the server is shutting down"), start);
    if (Status s = Validate(*req); !s.ok()) return Finish(s, start);
    if (Status s = internal::CheckClientRequestId(req->id()); !s.ok()) return Finish(s, start);
    StatusOr<std::string> tenant = internal::TenantOf(*ctx, options.tenant_metadata);
    if (!tenant.ok()) return Finish(tenant.status(), start);
    // The in-flight request budget (admission.h): wait briefly, else refuse.
    const auto message_bytes = static_cast<std::int64_t>(req->ByteSizeLong());
    // (No deadline reads as gpr_inf_future; the clamp keeps the sum finite.)
    const auto to_deadline = std::min<std::chrono::system_clock::duration>(
        ctx->deadline() - std::chrono::system_clock::now(), std::chrono::hours(1));
    const Clock::time_point admit_by =
        Clock::now() + std::min<Clock::duration>(options.admission_wait,
                                                 std::chrono::duration_cast<Clock::duration>(to_deadline));
    if (Status s = budget->Acquire(message_bytes, admit_by); !s.ok()) return Finish(s, start);
    const std::shared_ptr<void> release(nullptr, [this, message_bytes](void*) { budget->Release(message_bytes); });
    if (req->release_size() > 0) {
      Status ignored;  // refusals are counted in ShmStats, never fail the call
      internal::ReleaseAnyLeases(arena.get(), ipc.get(), req->release(), &ignored);
    }
    // CUDA IPC for device-resident rows; the rest (and the overflow) by
    // shared memory when the call allows it, else inline (ipc_delivery.h).
    const bool by_ipc = req->delivery() == v1::DELIVERY_CUDA_IPC && ipc != nullptr;
    const bool by_shm =
        req->delivery() == v1::DELIVERY_SHM || (req->delivery() == v1::DELIVERY_CUDA_IPC && req->ipc_fallback_shm());
    std::function<bool(const Embedding&, v1::EncodedItem*)> place_payload;
    StatusOr<internal::LeaseOwners> owners = SessionOwners(*ctx, by_ipc || (by_shm && arena != nullptr));
    if (!owners.ok()) return Finish(owners.status(), start);
    if (by_shm && arena != nullptr) {
      // ToProto has set out->key() (the content key) before it offers the rows.
      place_payload = [this, owner = owners->shm](const Embedding& e, v1::EncodedItem* out) {
        return internal::PlaceInArena(*arena, out->key(), e, out, owner);
      };
    }

    EncodeRequest request;
    // Assigned ids use a prefix client ids may not (request_id.h).
    request.id = req->id().empty() ? internal::AutoRequestId(next_auto_id++) : req->id();
    request.tenant = std::move(*tenant);
    request.items.reserve(req->items_size());
    // The image bytes move out of the message instead of being copied, so a
    // request's bytes are held once, not twice, while it is in flight. gRPC
    // hands the handler a message it destroys unread once the handler
    // returns, so taking its strings changes nothing it sees.
    for (v1::EncodeItem& item : *const_cast<v1::EncodeRequest*>(req)->mutable_items()) {
      EncodeItemInput in;
      in.expected_tokens = item.expected_tokens();
      if (!item.video().empty() || item.has_video_frames()) {
        VideoInput v;
        v.container = std::move(*item.mutable_video());
        for (const std::string& f : item.video_frames().frames()) v.frames.emplace_back(f);
        if (item.has_sampling()) v.sampling = internal::FromProto(item.sampling(), worker_options.video_sampling);
        in.video = std::move(v);
        request.items.push_back(std::move(in));
        continue;
      }
      in.media = std::move(*item.mutable_image());
      if (!item.caller_key().empty()) in.caller_key = item.caller_key();
      request.items.push_back(std::move(in));
    }

    auto state = std::make_shared<CallState>();
    RequestCallbacks callbacks;
    callbacks.on_item = [this, state](const ItemResult& r) {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->abandoned) return;
      buffered_bytes.fetch_add(ResultBytes(r));
      state->ready.push_back(r);
      state->cv.notify_one();
    };
    callbacks.on_done = [state](const RequestResult& r) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->done = true;
      state->request_status = r.status;
      state->cv.notify_one();
    };
    const std::string id = request.id;
    const std::size_t n = request.items.size();
    loop->Submit(std::move(request), std::move(callbacks));

    // No deadline reads as gpr_inf_future, far beyond any real one.
    const auto remaining = ctx->deadline() - std::chrono::system_clock::now();
    const bool has_deadline = remaining < std::chrono::hours(24 * 365);
    const Clock::time_point deadline =
        has_deadline ? start + std::chrono::duration_cast<Clock::duration>(remaining) : Clock::time_point::max();

    std::int64_t first_failed = -1;
    Status first_failure;
    std::size_t failed = 0, written = 0;
    Status give_up;  // set when the handler leaves before the request is done
    v1::EncodedItem msg;
    for (;;) {
      std::deque<ItemResult> batch;
      bool done = false;
      {
        std::unique_lock<std::mutex> lock(state->mu);
        const Clock::time_point wake = std::min(deadline, Clock::now() + options.cancel_poll);
        state->cv.wait_until(lock, wake, [&] { return !state->ready.empty() || state->done; });
        batch.swap(state->ready);
        done = state->done;
      }
      for (ItemResult& r : batch) {
        const std::int64_t bytes = ResultBytes(r);
        if (!r.status.ok()) {
          ++failed;
          // The worker's message says what is wrong; EncodedItem::index says
          // which item, and the call's status below names it.
          if (first_failed < 0 || r.index < first_failed) {
            first_failed = r.index;
            first_failure = r.status;
          }
        }
        msg.Clear();
        if (!by_ipc || !internal::ToProtoByIpc(*ipc, ipc_device_name, r, options.server_id, &msg, owners->ipc)) {
          internal::ToProto(r, options.server_id, &msg, place_payload);
        }
        r.embedding.reset();
        // The last item goes out with the call's status in one batch
        // (WriteLast buffers it until the handler returns, which it does as
        // soon as the worker reports the request done, right after its last
        // item): one send and one wake-up fewer per call, which is most of a
        // single-item hit's transport work.
        const bool last = written + 1 == n;
        // (WriteLast reports nothing: a client gone by then shows in the
        // status, as it would after any last Write.)
        bool ok = give_up.ok();
        if (ok && last) {
          writer->WriteLast(msg, grpc::WriteOptions());
        } else if (ok) {
          ok = writer->Write(msg);
        }
        Unbuffer(bytes);
        if (!ok && give_up.ok()) give_up = Cancelled("the client went away while results were streaming");
        if (ok) ++written;
      }
      if (!give_up.ok()) break;
      if (done) break;
      if (Clock::now() >= deadline) {
        give_up = Status(StatusCode::kDeadlineExceeded,
                         "the deadline passed after " + std::to_string(written) + " of " + std::to_string(n) +
                             " items were sent; the rest were dropped (raise the deadline or retry)");
        break;
      }
      if (ctx->IsCancelled()) {
        give_up = Cancelled("the client cancelled the call");
        break;
      }
    }

    if (!give_up.ok()) {
      std::int64_t left = 0;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->abandoned = true;
        for (const ItemResult& r : state->ready) left += ResultBytes(r);
        state->ready.clear();
      }
      Unbuffer(left);
      loop->Cancel(id);
      return Finish(give_up, start);
    }
    if (!state->request_status.ok()) return Finish(state->request_status, start);
    if (failed > 0) {
      // The one place an item's message leaves the process with its name.
      Status s(first_failure.code(), "item " + std::to_string(first_failed) + ": " + first_failure.message());
      if (n > 1) {
        s = Status(s.code(), s.message() + " (" + std::to_string(failed) + " of " + std::to_string(n) +
                                 " items failed; the others were sent)");
      }
      return Finish(s, start);
    }
    return Finish(Status::Ok(), start);
  }

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

  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*, v1::StatsResponse* out) override {
    if (Status s = auth->Check(*ctx); !s.ok()) return internal::ToGrpc(s);
    internal::ToProto(Snapshot(), out);
    return grpc::Status::OK;
  }
};

EncodeServer::EncodeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EncodeServer::~EncodeServer() { Shutdown(std::chrono::milliseconds(0)); }

StatusOr<std::unique_ptr<EncodeServer>> EncodeServer::Start(ServerOptions options, WorkerOptions worker_options,
                                                            std::unique_ptr<VisionTower> tower) {
  std::vector<std::string> addresses = {options.address};
  addresses.insert(addresses.end(), options.extra_addresses.begin(), options.extra_addresses.end());
  for (const std::string& a : addresses) {
    if (a.starts_with("unix:") ? a.size() == 5 : a.find(':') == std::string::npos) {
      return InvalidArgument("server address '" + a + "' is neither host:port nor unix:/path");
    }
  }
  if (options.shm_arena_bytes < 0) {
    return InvalidArgument("shm_arena_bytes must be >= 0 (0 = off), got " + std::to_string(options.shm_arena_bytes));
  }
  if (options.shm_lease.count() <= 0) {
    return InvalidArgument("shm_lease must be > 0 ms, got " + std::to_string(options.shm_lease.count()));
  }
  if (options.ipc_export_bytes < 0) {
    return InvalidArgument("ipc_export_bytes must be >= 0 (0 = off), got " + std::to_string(options.ipc_export_bytes));
  }
  if (options.ipc_lease.count() < 0) {
    return InvalidArgument("ipc_lease must be >= 0 ms (0 = shm_lease), got " + std::to_string(options.ipc_lease.count()));
  }
  if (options.shm_max_sessions <= 0) {
    return InvalidArgument("shm_max_sessions must be > 0, got " + std::to_string(options.shm_max_sessions));
  }
  if (options.max_items_per_request <= 0) {
    return InvalidArgument("max_items_per_request must be > 0, got " + std::to_string(options.max_items_per_request));
  }
  if (options.max_request_bytes <= 0 || options.max_request_bytes > std::int64_t{2047} << 20) {
    return InvalidArgument("max_request_bytes must be in (0, 2047 MiB], got " +
                           std::to_string(options.max_request_bytes));
  }
  if (options.max_inflight_request_bytes < options.max_request_bytes) {
    return InvalidArgument("max_inflight_request_bytes (" + std::to_string(options.max_inflight_request_bytes) +
                           ") must be >= max_request_bytes (" + std::to_string(options.max_request_bytes) +
                           "): a request of the largest accepted size must fit the budget");
  }
  if (options.admission_wait.count() < 0) return InvalidArgument("admission_wait must be >= 0");
  if (options.max_buffered_bytes <= 0) {
    return InvalidArgument("max_buffered_bytes must be > 0, got " + std::to_string(options.max_buffered_bytes));
  }
  if (options.max_rpc_threads < 2) {
    return InvalidArgument("max_rpc_threads must be >= 2, got " + std::to_string(options.max_rpc_threads));
  }
  if (options.cancel_poll.count() <= 0) return InvalidArgument("cancel_poll must be > 0");
  if (tower == nullptr) return InvalidArgument("tower is null");
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      internal::MakeServerCredentials(options.tls_cert_pem, options.tls_key_pem, options.tls_client_ca_pem);
  if (!credentials.ok()) return credentials.status();

  auto impl = std::make_unique<Impl>();
  Impl* self = impl.get();
  self->options = options;
  self->tower_description = tower->Describe();
  self->tower_hidden = tower->hidden();
  self->tower_deepstack = tower->deepstack_layers();
  self->tower_dtype = tower->dtype();
  self->metrics = std::make_shared<internal::ServerMetrics>([self] { return self->Snapshot(); });
  self->outcomes = std::make_unique<internal::CallOutcomes>(options.log);
  self->auth = std::make_unique<internal::TokenCheck>(options.auth_token);
  self->budget = std::make_unique<internal::RequestBudget>(
      options.max_inflight_request_bytes, options.max_inflight_request_bytes / 16, options.on_requests_drained);
  if (options.shm_arena_bytes > 0) {
    StatusOr<std::unique_ptr<internal::ShmArena>> arena =
        internal::ShmArena::Create(options.shm_arena_bytes, options.shm_lease);
    if (!arena.ok()) return arena.status();
    self->arena = std::move(*arena);
  }
  if (options.ipc_device != nullptr && options.ipc_export_bytes > 0) {
    StatusOr<std::unique_ptr<internal::IpcLeases>> ipc = internal::IpcLeases::Create(
        options.ipc_device, options.ipc_export_bytes,
        options.ipc_lease.count() > 0 ? options.ipc_lease : options.shm_lease);
    if (!ipc.ok()) return ipc.status();
    self->ipc = std::move(*ipc);
    self->ipc_device_name = options.ipc_device->Describe();
  }
  if (self->arena != nullptr || self->ipc != nullptr) {
    self->sessions =
        std::make_unique<internal::ShmSessions>(self->arena.get(), self->ipc.get(), options.shm_max_sessions);
  }

  std::function<bool()> user_sink_full = std::move(worker_options.sink_full);
  worker_options.sink_full = [self, user_sink_full] {
    return self->buffered_bytes.load(std::memory_order_relaxed) > self->options.max_buffered_bytes ||
           (user_sink_full && user_sink_full());
  };
  self->worker_options = worker_options;
  StatusOr<std::unique_ptr<EncodeWorker>> worker =
      EncodeWorker::Create(std::move(worker_options), internal::MeterTower(std::move(tower), self->metrics));
  if (!worker.ok()) return worker.status();
  self->loop = std::make_unique<WorkerLoop>(std::move(*worker));

  internal::EnableStandardServices();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, *credentials, &self->port);
  std::vector<int> extra_ports(options.extra_addresses.size(), 0);
  for (std::size_t i = 0; i < options.extra_addresses.size(); ++i) {
    builder.AddListeningPort(options.extra_addresses[i], *credentials, &extra_ports[i]);
  }
  // gRPC sets SO_REUSEPORT by default, so a second server on a busy port would
  // start and silently share its traffic; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(self);
  // gRPC refuses a message over its limit before any code of ours (the
  // interceptor included) sees the call, so such refusals could be neither
  // counted nor logged. Its limit is therefore a backstop at twice ours, and
  // Encode enforces max_request_bytes itself.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<std::int64_t>(2 * options.max_request_bytes, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(-1);
  // Idle handler threads wait for calls in slices of this length (10 s by
  // default), and gRPC's Shutdown joins them; a short slice keeps any wait on
  // an idle poller short, for the cost of five wake-ups a second per idle
  // poller. (The 10-13 s exits of issue 15 were not reproduced here; the
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
  grpc::ResourceQuota quota("epd-encode-server");
  quota.SetMaxThreads(options.max_rpc_threads);
  // The transport's buffers (received messages among them) are charged to
  // this quota; past it gRPC shrinks its flow-control windows and, under
  // severe pressure, cancels streams. Twice the handler budget, so that the
  // budget (counted, logged, with a clear message) is what a burst normally
  // meets, and the quota only backs it up.
  quota.Resize(static_cast<std::size_t>(2 * options.max_inflight_request_bytes));
  builder.SetResourceQuota(quota);
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
    self->loop->Shutdown(std::chrono::milliseconds(0));
    return Status(StatusCode::kUnavailable, "cannot listen on " + (unbound.empty() ? options.address : unbound) +
                                                " (address in use, not a local address, or a socket path that "
                                                "exists already?)");
  }
  if (options.address.starts_with("unix:")) self->port = 0;
  if (self->options.server_id.empty()) {
    self->options.server_id =
        HostName() + ":" + (options.address.starts_with("unix:") ? options.address : std::to_string(self->port));
  }
  if (options.metrics_port >= 0) {
    if (Status s = self->metrics->Serve(options.metrics_address, options.metrics_port); !s.ok()) {
      self->server->Shutdown(std::chrono::system_clock::now());
      self->loop->Shutdown(std::chrono::milliseconds(0));
      return s;
    }
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
  impl_->metrics->Stop();
  impl_->loop->Shutdown(std::chrono::milliseconds(0));
}

}  // namespace epd
