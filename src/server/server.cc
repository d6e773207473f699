// EncodeServer: gRPC over a WorkerLoop. Encode and Session use gRPC's
// callback API; Health, Stats and Release, which do no waiting, are sync.
//
// Threads: gRPC's own (they receive calls and run the callback reactions),
// the sync methods' handler threads, the WorkerLoop thread, a small TaskPool,
// and the metrics exposer's thread.
//
// An Encode call (EncodeCall) holds no thread while it waits. The worker's
// callbacks queue each ItemResult (a shared pointer, no copy) on the call;
// then one party at a time, the holder of the call's writer role, builds a
// reply and starts its write:
//   - When every payload goes by reference (shared memory, CUDA IPC), the
//     reply is a few hundred bytes, and the worker thread builds and starts
//     it itself. A single-item hit then costs one hand-off between threads
//     (gRPC's receiving thread to the worker) where a sync handler cost
//     three (to the worker, back to the handler, and gRPC's hand-off of the
//     polling role).
//   - Inline rows are copied into the reply on the TaskPool, never on the
//     worker thread, so a large reply does not delay tower batches.
// The last item goes out with the call's status (StartWriteAndFinish): one
// send per single-item call. A slow client delays only its own writes; what
// it leaves queued is counted in buffered_bytes, and the worker's
// sink_full() stops starting tower batches while that passes the limit.
//
// Cancellation and deadlines reach the call at once (OnCancel): it cancels
// the request in the worker, and items delivered after that are dropped
// without being buffered.
//
// Why not the sync API, as before: under load, gRPC 1.51's sync server
// paused every call for about 70 ms roughly once a second (no thread was
// polling its sockets; docs/BENCHMARKS-server.md), and its three hand-offs
// per call were a large part of a hit's cost on a small machine.
#include "epd/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
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
#include "task_pool.h"
#include "tls.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

// Idle gRPC handler threads kept waiting for calls of the sync methods (see
// Start).
constexpr int kIdleRpcThreads = 16;
// How often an Encode call that found the request budget full looks again.
constexpr auto kAdmissionRetry = std::chrono::milliseconds(2);
// gRPC's deadline timer may fire this much before the deadline as read back
// from the call's context; a cancellation within it counts as the deadline.
constexpr auto kDeadlineSlack = std::chrono::milliseconds(5);
// Threads that build inline replies and retry admissions (task_pool.h).
int PoolThreads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, 8u)); }

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

std::int64_t ResultBytes(const ItemResult& r) {
  return r.embedding != nullptr ? static_cast<std::int64_t>(r.embedding->nbytes()) : 0;
}

}  // namespace

// One Encode call on gRPC's callback API. Its reactions (gRPC's threads),
// the worker's callbacks (the worker thread) and its tasks on the server's
// TaskPool may run at once; mu_ orders them. One of them at a time holds the
// writer role (writer_), and only it builds a reply, starts a write or
// finishes the call. No gRPC call (StartWrite, Finish) is made under mu_,
// since gRPC may run a reaction inline.
//
// Owned by shared pointers: its own (self_, dropped in OnDone) and those the
// worker's callbacks and pool tasks hold, so an item delivered after the
// call ended finds a live object, which drops it.
class EncodeCall final : public grpc::ServerWriteReactor<v1::EncodedItem>,
                         public std::enable_shared_from_this<EncodeCall> {
 public:
  EncodeCall(EncodeServer::Impl& server, grpc::CallbackServerContext* ctx, const v1::EncodeRequest* req)
      : server_(server), ctx_(ctx), req_(req), start_(Clock::now()) {}

  // The checks of server.h's step 1, then admission and submission; a
  // refusal finishes the call. Runs on the gRPC thread that created it.
  void Start();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Takes the request budget, or tries again on the pool every
  // kAdmissionRetry until admit_by_; then submits. Holds the writer role.
  void Admit();
  void Submit();
  void Deliver(const ItemResult& r);  // the worker's on_item
  void Done(const RequestResult& r);  // the worker's on_done
  // With the writer role: writes the next item, finishes the call, or gives
  // the role back when there is nothing to do yet.
  void Pump();
  // Pump() from the worker thread: there when every payload goes by
  // reference (shared memory, CUDA IPC), else on the pool, so that the
  // worker never copies rows into an inline reply.
  void PumpFromWorker();
  // Finishes the call with `s` and no (further) write. REQUIRES: the writer
  // role, or the call was never handed to the worker.
  void FinishWith(const Status& s);
  Status FinalStatus() const;  // REQUIRES: mu_ held, done_

  EncodeServer::Impl& server_;
  grpc::CallbackServerContext* const ctx_;
  const v1::EncodeRequest* const req_;  // gRPC's; valid until OnDone
  const Clock::time_point start_;
  std::shared_ptr<EncodeCall> self_;  // gRPC's reference, until OnDone

  // Set by Start, before another thread sees the call.
  Clock::time_point admit_by_;
  std::int64_t message_bytes_ = 0;
  std::string id_, tenant_;
  std::size_t n_ = 0;
  bool by_ipc_ = false;
  std::uint64_t ipc_owner_ = 0;  // the call's session's owner in the CUDA IPC leases, 0 = none
  bool references_ = false;      // payloads go by reference: cheap to build on any thread
  std::function<bool(const Embedding&, v1::EncodedItem*)> place_payload_;

  v1::EncodedItem msg_;         // the write in flight (writer role)
  std::int64_t msg_bytes_ = 0;  // its item's buffered bytes

  std::mutex mu_;
  bool writer_ = true;            // Start holds the role until the request is submitted
  bool admitted_ = false;         // message_bytes_ of the budget are held
  bool submitted_ = false;        // the worker has the request
  bool finished_ = false;         // Finish or StartWriteAndFinish called
  bool done_ = false;             // on_done fired
  Status request_status_;         // RequestResult::status, valid once done_
  Status give_up_;                // cancelled, past the deadline, or the client went away
  std::deque<ItemResult> ready_;  // delivered, not yet written
  std::size_t delivered_ = 0, written_ = 0, failed_ = 0;
  std::int64_t first_failed_ = -1;
  Status first_failure_;
};

// Session (lease sessions, shm_session.h) uses the callback API; every
// other method is sync.
struct EncodeServer::Impl final
    : public v1::Encoder::WithCallbackMethod_Encode<v1::Encoder::WithCallbackMethod_Session<v1::Encoder::Service>> {
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
  std::unique_ptr<internal::ShmArena> arena;        // null = no shared-memory delivery
  std::unique_ptr<internal::IpcLeases> ipc;         // null = no CUDA IPC delivery
  std::string ipc_device_name;                      // ipc's Device::Describe(), sent in every CudaIpcRef
  std::unique_ptr<internal::ShmSessions> sessions;  // lease sessions over `arena` and `ipc`; null without both
  std::unique_ptr<internal::TaskPool> pool;         // inline replies, admission retries (EncodeCall)
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

grpc::ServerWriteReactor<v1::EncodedItem>* EncodeServer::Impl::Encode(grpc::CallbackServerContext* ctx,
                                                                      const v1::EncodeRequest* req) {
  auto call = std::make_shared<EncodeCall>(*this, ctx, req);
  call->Start();
  return call.get();
}

void EncodeCall::Start() {
  self_ = shared_from_this();
  EncodeServer::Impl& s = server_;
  if (Status st = s.auth->Check(*ctx_); !st.ok()) return FinishWith(st);
  message_bytes_ = static_cast<std::int64_t>(req_->ByteSizeLong());
  if (const std::int64_t bytes = message_bytes_; bytes > s.options.max_request_bytes) {
    return FinishWith(
        ResourceExhausted("the request is " + std::to_string(bytes) + " bytes; this server accepts at most " +
                          std::to_string(s.options.max_request_bytes) + " (split it, or raise --max-request-mb)"));
  }
  if (!s.serving.load()) return FinishWith(Status(StatusCode::kUnavailable, "the server is shutting down"));
  if (Status st = s.Validate(*req_); !st.ok()) return FinishWith(st);
  if (Status st = internal::CheckClientRequestId(req_->id()); !st.ok()) return FinishWith(st);
  StatusOr<std::string> tenant = internal::TenantOf(*ctx_, s.options.tenant_metadata);
  if (!tenant.ok()) return FinishWith(tenant.status());
  tenant_ = std::move(*tenant);
  // CUDA IPC for device-resident rows; the rest (and the overflow) by shared
  // memory when the call allows it, else inline (ipc_delivery.h).
  by_ipc_ = req_->delivery() == v1::DELIVERY_CUDA_IPC && s.ipc != nullptr;
  const bool by_shm =
      req_->delivery() == v1::DELIVERY_SHM || (req_->delivery() == v1::DELIVERY_CUDA_IPC && req_->ipc_fallback_shm());
  // The lease session the call names, if any (all owners 0: none, or not open).
  StatusOr<internal::LeaseOwners> owners = s.SessionOwners(*ctx_, by_ipc_ || (by_shm && s.arena != nullptr));
  if (!owners.ok()) return FinishWith(owners.status());
  ipc_owner_ = owners->ipc;
  if (by_shm && s.arena != nullptr) {
    // ToProto has set out->key() (the content key) before it offers the rows.
    place_payload_ = [&s, owner = owners->shm](const Embedding& e, v1::EncodedItem* out) {
      return internal::PlaceInArena(*s.arena, out->key(), e, out, owner);
    };
  }
  // (Rows that overflow the arena or the export bound go inline, built on
  // whichever thread holds the role: rare, and bounded by the request.)
  references_ = by_ipc_ || place_payload_ != nullptr;
  // No deadline reads as gpr_inf_future; the clamp keeps the sum finite.
  const auto to_deadline = std::min<std::chrono::system_clock::duration>(
      ctx_->deadline() - std::chrono::system_clock::now(), std::chrono::hours(1));
  admit_by_ = Clock::now() + std::min<Clock::duration>(s.options.admission_wait,
                                                       std::chrono::duration_cast<Clock::duration>(to_deadline));
  // Assigned ids use a prefix client ids may not (request_id.h).
  id_ = req_->id().empty() ? internal::AutoRequestId(s.next_auto_id++) : req_->id();
  n_ = static_cast<std::size_t>(req_->items_size());
  Admit();
}

void EncodeCall::Admit() {
  EncodeServer::Impl& s = server_;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!give_up_.ok()) {
      const Status g = give_up_;
      lock.unlock();
      return FinishWith(g);
    }
  }
  // The in-flight request budget (admission.h): a call that finds no room
  // tries again every kAdmissionRetry until admit_by_, holding no thread.
  const bool last_try = Clock::now() >= admit_by_;
  Status st = s.budget->Acquire(message_bytes_, Clock::now());  // no wait: a past deadline
  if (!st.ok() && !last_try) {
    s.pool->PostAt(std::min(admit_by_, Clock::now() + kAdmissionRetry), [self = shared_from_this()] { self->Admit(); });
    return;
  }
  if (!st.ok()) return FinishWith(st);
  {
    std::lock_guard<std::mutex> lock(mu_);
    admitted_ = true;
  }
  Submit();
}

void EncodeCall::Submit() {
  EncodeServer::Impl& s = server_;
  if (req_->release_size() > 0) {
    Status ignored;  // refusals are counted in ShmStats, never fail the call
    internal::ReleaseAnyLeases(s.arena.get(), s.ipc.get(), req_->release(), &ignored);
  }
  EncodeRequest request;
  request.id = id_;
  request.tenant = std::move(tenant_);
  request.items.reserve(n_);
  // The image bytes move out of the message instead of being copied, so a
  // request's bytes are held once, not twice, while it is in flight. The
  // message is this call's alone, and nothing reads it after this.
  for (v1::EncodeItem& item : *const_cast<v1::EncodeRequest*>(req_)->mutable_items()) {
    EncodeItemInput in;
    in.expected_tokens = item.expected_tokens();
    if (!item.video().empty() || item.has_video_frames()) {
      VideoInput v;
      v.container = std::move(*item.mutable_video());
      for (const std::string& f : item.video_frames().frames()) v.frames.emplace_back(f);
      if (item.has_sampling()) v.sampling = internal::FromProto(item.sampling(), s.worker_options.video_sampling);
      in.video = std::move(v);
      request.items.push_back(std::move(in));
      continue;
    }
    in.media = std::move(*item.mutable_image());
    if (!item.caller_key().empty()) in.caller_key = item.caller_key();
    request.items.push_back(std::move(in));
  }
  RequestCallbacks callbacks;
  callbacks.on_item = [self = shared_from_this()](const ItemResult& r) { self->Deliver(r); };
  callbacks.on_done = [self = shared_from_this()](const RequestResult& r) { self->Done(r); };
  {
    std::lock_guard<std::mutex> lock(mu_);
    submitted_ = true;
  }
  s.loop->Submit(std::move(request), std::move(callbacks));
  // Items delivered meanwhile waited for the role Start held.
  Pump();
}

void EncodeCall::Deliver(const ItemResult& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || !give_up_.ok()) return;
    server_.buffered_bytes.fetch_add(ResultBytes(r));
    ready_.push_back(r);
    ++delivered_;
    if (writer_) return;
    // The last item: on_done follows at once on this thread, and takes the
    // role then, so the item and the status go out together.
    if (delivered_ == n_ && !done_) return;
    writer_ = true;
  }
  PumpFromWorker();
}

void EncodeCall::Done(const RequestResult& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    request_status_ = r.status;
    if (finished_ || writer_) return;
    writer_ = true;
  }
  PumpFromWorker();
}

void EncodeCall::PumpFromWorker() {
  if (references_) return Pump();
  server_.pool->Post([self = shared_from_this()] { self->Pump(); });
}

void EncodeCall::Pump() {
  EncodeServer::Impl& s = server_;
  std::unique_lock<std::mutex> lock(mu_);
  if (finished_) {
    writer_ = false;
    return;
  }
  if (!give_up_.ok()) {
    std::int64_t left = 0;
    for (const ItemResult& r : ready_) left += ResultBytes(r);
    ready_.clear();
    const bool cancel_worker = submitted_ && !done_;
    const Status g = give_up_;
    lock.unlock();
    s.Unbuffer(left);
    if (cancel_worker) s.loop->Cancel(id_);
    return FinishWith(g);
  }
  // The last item waits for on_done, to go out with the call's status.
  const bool last = written_ + 1 == n_;
  if (!ready_.empty() && (!last || done_)) {
    ItemResult r = std::move(ready_.front());
    ready_.pop_front();
    if (!r.status.ok()) {
      ++failed_;
      // The worker's message says what is wrong; EncodedItem::index says
      // which item, and the call's status names it.
      if (first_failed_ < 0 || r.index < first_failed_) {
        first_failed_ = r.index;
        first_failure_ = r.status;
      }
    }
    Status final_status;
    if (last) {
      final_status = FinalStatus();
      finished_ = true;
    }
    lock.unlock();
    msg_.Clear();
    if (!by_ipc_ || !internal::ToProtoByIpc(*s.ipc, s.ipc_device_name, r, s.options.server_id, &msg_, ipc_owner_)) {
      internal::ToProto(r, s.options.server_id, &msg_, place_payload_);
    }
    msg_bytes_ = ResultBytes(r);
    r.embedding.reset();
    if (!last) return StartWrite(&msg_);
    // The last item and the status go out in one batch: one send and one
    // wake-up fewer per call, which is most of a single-item hit's transport
    // work. (It has no OnWriteDone; a client gone by then shows in OnDone.)
    s.Unbuffer(msg_bytes_);
    s.metrics->ObserveCall(std::chrono::duration<double>(Clock::now() - start_).count());
    return StartWriteAndFinish(&msg_, grpc::WriteOptions(), internal::ToGrpc(final_status));
  }
  if (done_ && ready_.empty()) {
    const Status st = FinalStatus();
    lock.unlock();
    return FinishWith(st);
  }
  writer_ = false;
}

void EncodeCall::OnWriteDone(bool ok) {
  server_.Unbuffer(msg_bytes_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ok) {
      ++written_;
    } else if (give_up_.ok()) {
      give_up_ = Cancelled("the client went away while results were streaming");
    }
  }
  Pump();
}

void EncodeCall::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || !give_up_.ok()) return;
    // gRPC cancels a call at its deadline too; tell the two apart (the timer
    // may fire a little before the deadline read back from the context).
    if (std::chrono::system_clock::now() + kDeadlineSlack >= ctx_->deadline()) {
      give_up_ = Status(StatusCode::kDeadlineExceeded,
                        "the deadline passed after " + std::to_string(written_) + " of " + std::to_string(n_) +
                            " items were sent; the rest were dropped (raise the deadline or retry)");
    } else {
      give_up_ = Cancelled("the client cancelled the call");
    }
    // Whoever holds the role (a write in flight, a pending admission retry,
    // a delivery) finishes the call when it next looks.
    if (writer_) return;
    writer_ = true;
  }
  Pump();
}

void EncodeCall::FinishWith(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  server_.metrics->ObserveCall(std::chrono::duration<double>(Clock::now() - start_).count());
  Finish(internal::ToGrpc(s));  // counted and logged by `outcomes`' interceptor
}

Status EncodeCall::FinalStatus() const {
  if (!request_status_.ok()) return request_status_;
  if (failed_ == 0) return Status::Ok();
  // The one place an item's message leaves the process with its name.
  Status s(first_failure_.code(), "item " + std::to_string(first_failed_) + ": " + first_failure_.message());
  if (n_ > 1) {
    s = Status(s.code(), s.message() + " (" + std::to_string(failed_) + " of " + std::to_string(n_) +
                             " items failed; the others were sent)");
  }
  return s;
}

void EncodeCall::OnDone() {
  bool admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    admitted = admitted_;
  }
  if (admitted) server_.budget->Release(message_bytes_);
  self_.reset();  // may destroy this
}

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
    return InvalidArgument("ipc_lease must be >= 0 ms (0 = shm_lease), got " +
                           std::to_string(options.ipc_lease.count()));
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
  self->pool = std::make_unique<internal::TaskPool>(PoolThreads());
  self->budget = std::make_unique<internal::RequestBudget>(
      options.max_inflight_request_bytes, options.max_inflight_request_bytes / 16, options.on_requests_drained);
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
  grpc::ResourceQuota quota("epd-encode-server");
  quota.SetMaxThreads(options.max_rpc_threads);
  // The transport's buffers (received messages among them) are charged to
  // this quota; past it gRPC shrinks its flow-control windows and, under
  // severe pressure, cancels streams. Twice the request budget, so that the
  // budget (counted, logged, with a clear message) is what a burst normally
  // meets, and the quota only backs it up. It also bounds the messages of
  // Encode calls waiting for admission, which hold no thread.
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
  // Every call has finished: nothing of theirs is left on the pool.
  impl_->pool->Shutdown();
  impl_->metrics->Stop();
  impl_->loop->Shutdown(std::chrono::milliseconds(0));
}

}  // namespace epd
