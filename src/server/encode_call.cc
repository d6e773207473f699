// See encode_call.h.
#include "encode_call.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "encode_items.h"
#include "ipc_delivery.h"
#include "request_id.h"
#include "server_impl.h"
#include "shm_delivery.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

// A cancellation this close to the deadline read back from the call's
// context counts as the deadline: at least kDeadlineSlack, and at least
// 1/kDeadlineSlackDivisor of the time the call had when it arrived. The
// client's own timer usually ends the call first, and its deadline is
// earlier than the server's: gRPC sends the time left (grpc-timeout) rounded
// up to a few significant digits, and the server counts it from arrival.
// Measured on loopback: a client's 1000 ms deadline reached the server as a
// cancel 7 to 8 ms before the server's deadline (EncodeCallTest.DeadlineMid-
// Stream*), past the 5 ms allowed before.
constexpr auto kDeadlineSlack = std::chrono::milliseconds(5);
constexpr int kDeadlineSlackDivisor = 50;
// The method's name as gRPC reports it (what CallOutcomes counts under).
constexpr char kEncodeMethod[] = "/epd.v1.Encoder/Encode";

std::int64_t ResultBytes(const ItemResult& r) {
  return r.embedding != nullptr ? static_cast<std::int64_t>(r.embedding->nbytes()) : 0;
}

}  // namespace

grpc::ServerWriteReactor<v1::EncodedItem>* EncodeServer::Impl::Encode(grpc::CallbackServerContext* ctx,
                                                                      const v1::EncodeRequest* req) {
  auto call = std::make_shared<EncodeCall>(*this, ctx, req);
  call->Start();
  return call.get();
}

void EncodeCall::Start() {
  self_ = shared_from_this();
  EncodeServer::Impl& s = server_;
  StatusOr<internal::Caller> caller = s.tenants->Identify(*ctx_);
  if (!caller.ok()) return FinishWith(caller.status());
  caller_ = std::move(*caller);
  message_bytes_ = static_cast<std::int64_t>(req_->ByteSizeLong());
  if (!s.serving.load()) return FinishWith(Status(StatusCode::kUnavailable, "the server is shutting down"));
  // Size, items, kinds and id: the rules every front shares (request_shape.h).
  if (Status st = CheckRequestShape(internal::ShapeOf(*req_, message_bytes_),
                                    {s.options.max_items_per_request, s.options.max_request_bytes});
      !st.ok()) {
    return FinishWith(st);
  }
  tenant_ = caller_.share;
  connection_ = ctx_->peer();
  account_ = s.replies->Open(tenant_, connection_);
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
  deadline_slack_ = std::max<std::chrono::system_clock::duration>(kDeadlineSlack, to_deadline / kDeadlineSlackDivisor);
  // Assigned ids use a prefix client ids may not (request_id.h).
  id_ = req_->id().empty() ? internal::AutoRequestId(s.next_auto_id++) : req_->id();
  n_ = static_cast<std::size_t>(req_->items_size());
  Admit();
}

void EncodeCall::Admit() {
  EncodeServer::Impl& s = server_;
  // The in-flight request budget (admission.h): Admitted runs once the
  // bytes fit, at admit_by_ with a refusal, or on a cancel, holding no
  // thread meanwhile.
  {
    MutexLock lock(mu_);
    admitting_ = true;
  }
  const internal::RequestBudget::WaiterId id = s.budget->Acquire(
      message_bytes_, admit_by_, [self = shared_from_this()](const Status& st) { self->Admitted(st); });
  Status cancel;
  {
    MutexLock lock(mu_);
    if (!admitting_) return;  // Admitted ran already
    waiter_ = id;
    cancel = give_up_;  // OnCancel came first, and left the waiter to us
  }
  if (!cancel.ok()) s.budget->Cancel(id, cancel);
}

void EncodeCall::Admitted(const Status& st) {
  Status g;
  {
    MutexLock lock(mu_);
    admitting_ = false;
    waiter_ = 0;
    admitted_ = st.ok();  // OnDone gives the bytes back
    g = give_up_;
  }
  if (!st.ok()) return FinishWith(g.ok() ? st : g);
  if (!g.ok()) return FinishWith(g);
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
  request.tenant = tenant_;
  request.key_namespace = caller_.key_namespace;
  s.tenant_stats->CountRequest(caller_.tenant);
  request.items.reserve(n_);
  // The image bytes move out of the message instead of being copied, so a
  // request's bytes are held once, not twice, while it is in flight. The
  // message is this call's alone, and nothing reads it after this.
  for (v1::EncodeItem& item : *const_cast<v1::EncodeRequest*>(req_)->mutable_items()) {
    request.items.push_back(internal::ItemFromProto(std::move(item), s.worker_options.video_sampling));
  }
  RequestCallbacks callbacks;
  callbacks.on_item = [self = shared_from_this()](const ItemResult& r) { self->Deliver(r); };
  callbacks.on_done = [self = shared_from_this()](const RequestResult& r) { self->Done(r); };
  {
    MutexLock lock(mu_);
    submitted_ = true;
  }
  s.loop->Submit(std::move(request), std::move(callbacks), &ticket_);
  // Items delivered meanwhile waited for the role Start held.
  PumpOrPost();
}

void EncodeCall::Deliver(const ItemResult& r) {
  server_.tenant_stats->CountItem(caller_.tenant, r);
  {
    MutexLock lock(mu_);
    if (finished_ || !give_up_.ok()) return;
    // Past its tenant's share the call is throttled: its results wait here
    // and no longer count towards stopping the tower (reply_budget.h).
    if (server_.replies->Buffer(account_, ResultBytes(r)) && !throttled_) {
      throttled_ = true;
      server_.replies->CountThrottled();
    }
    ready_.push_back(r);
    ++delivered_;
    if (writer_) return;
    // The last item: on_done follows at once on this thread, and takes the
    // role then, so the item and the status go out together.
    if (delivered_ == n_ && !done_) return;
    writer_ = true;
  }
  PumpOrPost();
}

void EncodeCall::Done(const RequestResult& r) {
  {
    MutexLock lock(mu_);
    done_ = true;
    request_status_ = r.status;
    if (finished_ || writer_) return;
    writer_ = true;
  }
  PumpOrPost();
}

void EncodeCall::PumpOrPost() {
  if (references_) return Pump();
  server_.pool->Post([self = shared_from_this()] { self->Pump(); });
}

void EncodeCall::Pump() {
  MutexLock lock(mu_);
  if (finished_) {
    writer_ = false;
    return;
  }
  if (!give_up_.ok()) return GiveUp(lock);
  // The last item waits for on_done, to go out with the call's status.
  const bool last = written_ + 1 == n_;
  if (!ready_.empty() && (!last || done_)) {
    if (HeldByFloor(ready_.front())) {
      writer_ = false;  // a delivery or OnCancel may take the role meanwhile
      return;
    }
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
    lock.Unlock();
    return Write(std::move(r), last);
  }
  if (done_ && ready_.empty()) {
    const Status st = FinalStatus();
    lock.Unlock();
    return FinishWith(st);
  }
  writer_ = false;
}

// The analysis cannot follow a scoped lock passed by reference (clang 14):
// it would see lock.Unlock() release a lock it does not know.
void EncodeCall::GiveUp(MutexLock& lock) EPD_NO_THREAD_SAFETY_ANALYSIS {
  EncodeServer::Impl& s = server_;
  std::int64_t left = 0;
  for (const ItemResult& r : ready_) left += ResultBytes(r);
  ready_.clear();
  const bool cancel_worker = submitted_ && !done_;
  const Status g = give_up_;
  lock.Unlock();
  s.replies->Unbuffer(account_, left);
  // By ticket: a call refused for an id another call holds (ALREADY_EXISTS)
  // must not cancel that call.
  if (cancel_worker) s.loop->Cancel(id_, ticket_);
  FinishWith(g);
}

void EncodeCall::Write(ItemResult r, bool last) {
  EncodeServer::Impl& s = server_;
  msg_.Clear();
  if (!by_ipc_ || !internal::ToProtoByIpc(*s.ipc, s.ipc_device_name, r, s.options.server_id, &msg_, ipc_owner_)) {
    internal::ToProto(r, s.options.server_id, &msg_, place_payload_);
  }
  const std::int64_t item_bytes = ResultBytes(r);
  r.embedding.reset();
  // Held until the write completes: our message and gRPC's serialized copy
  // of it, each the message's size (measured: 200 unread 2.5 MiB replies
  // took 1048 MB of RSS, 2.0 times their bytes; docs/SERVER.md).
  const std::int64_t held = 2 * static_cast<std::int64_t>(msg_.ByteSizeLong());
  Status refusal = s.replies->Hold(account_, held);
  MutexLock lock(mu_);
  if (!refusal.ok() && give_up_.ok()) {
    give_up_ = Status(refusal.code(), refusal.message() + " (" + std::to_string(written_) + " of " +
                                          std::to_string(n_) + " items were sent)");
  }
  if (!give_up_.ok()) {
    // Refused, or cancelled while the reply was built: it is not sent. (A
    // reference reply's lease, if one was made, lapses at its deadline: a
    // reply of a few hundred bytes is refused only on a connection already
    // full of others.)
    lock.Unlock();
    msg_ = v1::EncodedItem();
    if (refusal.ok()) s.replies->Unhold(account_, held);
    s.replies->Unbuffer(account_, item_bytes);
    lock.Lock();
    return GiveUp(lock);
  }
  msg_bytes_ = item_bytes;
  msg_held_ = held;
  in_transport_ = true;
  write_started_ = Clock::now();
  ArmWriteTimer(write_started_ + s.options.write_timeout);
  if (!last) {
    lock.Unlock();
    return StartWrite(&msg_);
  }
  const Status final_status = FinalStatus();
  finished_ = true;
  final_ok_ = final_status.ok();
  lock.Unlock();
  // The last item and the status go out in one batch: one send and one
  // wake-up fewer per call, which is most of a single-item hit's transport
  // work. (It has no OnWriteDone; its bytes are given back in OnDone.)
  ObserveDuration();
  StartWriteAndFinish(&msg_, grpc::WriteOptions(), internal::ToGrpc(final_status));
}

void EncodeCall::OnWriteDone(bool ok) {
  server_.replies->Unhold(account_, msg_held_);
  server_.replies->Unbuffer(account_, msg_bytes_);
  msg_ = v1::EncodedItem();  // our copy of the rows goes now, not at the next write
  {
    MutexLock lock(mu_);
    msg_held_ = msg_bytes_ = 0;
    in_transport_ = false;
    if (ok) {
      ++written_;
    } else if (give_up_.ok()) {
      give_up_ = Cancelled("the client went away while results were streaming");
    }
  }
  PumpOrPost();
}

void EncodeCall::ArmWriteTimer(Clock::time_point due) {
  if (timer_armed_ || call_done_ || server_.options.write_timeout.count() <= 0) return;
  timer_armed_ = true;
  // A weak reference, and OnDone cancels the task: a finished call is
  // neither kept alive nor left on the pool's queue for the timeout.
  write_timer_ = server_.pool->PostAt(due, [weak = weak_from_this()] {
    if (std::shared_ptr<EncodeCall> self = weak.lock()) self->CheckWriteProgress();
  });
}

bool EncodeCall::HeldByFloor(const ItemResult& r) {
  if (!internal::HeldByMissFloor(server_.options, r)) return false;
  const Clock::time_point due = start_ + server_.options.miss_reply_floor;
  if (Clock::now() >= due) return false;
  if (!floor_armed_ && !call_done_) {
    floor_armed_ = true;
    // PostAt runs it no earlier than `due`, so whoever holds the role when
    // it runs finds the floor passed; a weak reference, as for the write timer.
    floor_timer_ = server_.pool->PostAt(due, [weak = weak_from_this()] {
      if (std::shared_ptr<EncodeCall> self = weak.lock()) self->FloorElapsed();
    });
  }
  return true;
}

void EncodeCall::FloorElapsed() {
  {
    MutexLock lock(mu_);
    floor_armed_ = false;
    if (writer_ || finished_) return;
    writer_ = true;
  }
  Pump();
}

void EncodeCall::CheckWriteProgress() {
  EncodeServer::Impl& s = server_;
  const auto timeout = s.options.write_timeout;
  Status why;
  bool record = false;
  {
    MutexLock lock(mu_);
    timer_armed_ = false;
    if (!in_transport_) return;  // no write waits on the client: nothing to time
    if (Clock::now() < write_started_ + timeout) return ArmWriteTimer(write_started_ + timeout);
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.1f", std::chrono::duration<double>(timeout).count());
    why = Cancelled(std::string("the client accepted no reply bytes for ") + secs +
                    " s (--write-timeout-s); the call was cancelled after " + std::to_string(written_) + " of " +
                    std::to_string(n_) + " items were sent");
    if (give_up_.ok()) give_up_ = why;
    // The last write went out with its status, which outcomes counted as OK:
    // this call's end is counted here. (Other calls finish with give_up_
    // when their write fails, and are counted then.)
    record = finished_ && final_ok_;
  }
  s.replies->CountWriteTimeout();
  if (record) s.outcomes->Record(kEncodeMethod, connection_, why);
  // Resetting the stream frees what gRPC holds for it; the write then fails
  // (OnWriteDone(false)) or the call ends (OnDone).
  std::lock_guard<std::recursive_mutex> lock(ctx_mu_);
  if (!ctx_done_) ctx_->TryCancel();
}

void EncodeCall::OnCancel() {
  bool pump = false;
  internal::RequestBudget::WaiterId waiter = 0;
  Status why;
  {
    MutexLock lock(mu_);
    if (finished_ || !give_up_.ok()) return;
    // gRPC cancels a call at its deadline too; tell the two apart (the timer
    // may fire a little before the deadline read back from the context).
    if (std::chrono::system_clock::now() + deadline_slack_ >= ctx_->deadline()) {
      give_up_ = Status(StatusCode::kDeadlineExceeded,
                        "the deadline passed after " + std::to_string(written_) + " of " + std::to_string(n_) +
                            " items were sent; the rest were dropped (raise the deadline or retry)");
    } else {
      give_up_ = Cancelled("the client cancelled the call");
    }
    // Whoever holds the role (a write in flight, a delivery) finishes the
    // call when it next looks; a call still waiting for the budget is ended
    // by cancelling its waiter (Admitted then finishes it). A waiter not yet
    // recorded is Admit's to cancel.
    if (!writer_) {
      writer_ = true;
      pump = true;
    } else if (admitting_) {
      waiter = waiter_;
      why = give_up_;
    }
  }
  if (waiter != 0) server_.budget->Cancel(waiter, why);
  if (pump) Pump();
}

void EncodeCall::FinishWith(const Status& s) {
  {
    MutexLock lock(mu_);
    if (finished_) return;
    finished_ = true;
  }
  if (s.code() == StatusCode::kResourceExhausted && !caller_.tenant.empty()) {
    server_.tenant_stats->CountRefusal(caller_.tenant);
  }
  ObserveDuration();
  Finish(internal::ToGrpc(s));  // counted and logged by `outcomes`' interceptor
}

void EncodeCall::ObserveDuration() {
  server_.metrics->ObserveCall(std::chrono::duration<double>(Clock::now() - start_).count());
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
  {
    std::lock_guard<std::recursive_mutex> lock(ctx_mu_);
    ctx_done_ = true;
  }
  bool admitted, lost_last = false;
  std::int64_t held, buffered;
  internal::TaskPool::TaskId timer, floor_timer;
  {
    MutexLock lock(mu_);
    admitted = admitted_;
    call_done_ = true;
    timer = timer_armed_ ? write_timer_ : internal::TaskPool::TaskId{};
    floor_timer = floor_armed_ ? floor_timer_ : internal::TaskPool::TaskId{};
    // The last write went out with an OK status (so counted as OK) and the
    // client went away before it arrived (ctx_ is valid until OnDone returns).
    lost_last = in_transport_ && final_ok_ && give_up_.ok() && ctx_->IsCancelled();
    // The last write's bytes (sent, or dropped with the stream), and any
    // result still queued on a call that ended without giving up.
    held = std::exchange(msg_held_, 0);
    buffered = std::exchange(msg_bytes_, 0);
    for (const ItemResult& r : ready_) buffered += ResultBytes(r);
    ready_.clear();
    in_transport_ = false;
  }
  server_.pool->Cancel(timer);
  server_.pool->Cancel(floor_timer);
  if (lost_last) {
    server_.outcomes->Record(kEncodeMethod, connection_,
                             Cancelled("the client went away before it read the last reply (" +
                                       std::to_string(written_) + " of " + std::to_string(n_) + " items were sent)"));
  }
  server_.replies->Unhold(account_, held);
  server_.replies->Unbuffer(account_, buffered);
  server_.replies->Close(account_);
  if (admitted) server_.budget->Release(message_bytes_);
  self_.reset();  // may destroy this
}

}  // namespace epd
