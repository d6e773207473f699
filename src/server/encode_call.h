// src/server/encode_call.h (internal): one Encode call, on gRPC's callback
// API.
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
//     worker thread (a large reply would delay tower batches) nor on gRPC's
//     (it would hold up other calls' reactions).
// The last item goes out with the call's status (StartWriteAndFinish): one
// send per single-item call. A slow client delays only its own writes.
//
// What its replies hold is charged to the server's ReplyBudget
// (reply_budget.h) under the call's tenant and connection: each delivered
// result's bytes are buffered until the write that carries it completes (the
// last one: until OnDone), and count towards the worker's sink_full() only
// up to the tenant's share; each reply handed to gRPC holds twice its
// message size (ours plus gRPC's serialized copy) until that write completes,
// and a reply that would pass the connection's or the server's reply budget
// ends the call with RESOURCE_EXHAUSTED naming it. A write the client has
// not accepted within ServerOptions::write_timeout cancels the call
// (counted, logged): a client that stops reading loses its call instead of
// pinning its replies for as long as it keeps the connection.
//
// Cancellation and deadlines reach the call when gRPC reports them
// (OnCancel), with no polling: it cancels the request in the worker, and items delivered after that are dropped
// without being buffered.
//
// Why not the sync API, as before: under load, gRPC 1.51's sync server
// paused every call for about 70 ms roughly once a second (no thread was
// polling its sockets; docs/BENCHMARKS-server.md), and its three hand-offs
// per call were a large part of a hit's cost on a small machine.
//
// Thread safety: see the class comment. Ownership: gRPC's reference to the
// call (EncodeCall::self_) ends in OnDone; the worker's callbacks and pool
// tasks hold their own.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "admission.h"
#include "epd/core/embedding.h"
#include "epd/core/encode_types.h"
#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/server/server.h"
#include "epd/v1/encoder.grpc.pb.h"
#include "epd/worker/worker_loop.h"
#include "reply_budget.h"
#include "task_pool.h"
#include "tenants.h"

namespace epd {

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
  using Clock = std::chrono::steady_clock;

  EncodeCall(EncodeServer::Impl& server, grpc::CallbackServerContext* ctx, const v1::EncodeRequest* req)
      : server_(server), ctx_(ctx), req_(req), start_(Clock::now()) {}

  // The checks of server.h's step 1, then admission and submission; a
  // refusal finishes the call. Runs on the gRPC thread that created it.
  void Start();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Builds the reply of `r`, charges it to the reply budget and starts its
  // write (`last`: with the call's status). A refusal by the budget gives
  // the call up instead. REQUIRES: the writer role.
  void Write(ItemResult r, bool last) EPD_EXCLUDES(mu_);
  // With the writer role and give_up_ set: drops the queued results, cancels
  // the request in the worker and finishes the call with give_up_. Releases
  // `lock` (over mu_) before it finishes the call.
  void GiveUp(MutexLock& lock) EPD_REQUIRES(mu_);
  // The write-progress timer (ServerOptions::write_timeout): one per call,
  // armed when a write is handed over and none is armed; when it fires it
  // cancels the call if that write has not completed in time, re-arms for
  // the write now in transport, or ends. OnDone cancels it.
  void ArmWriteTimer(Clock::time_point due) EPD_REQUIRES(mu_);
  void CheckWriteProgress();
  // ServerOptions::miss_reply_floor: true when `r` must wait until start_ +
  // the floor (internal::HeldByMissFloor, and that time not reached yet);
  // then posts FloorElapsed once (floor_timer_), which takes the writer role
  // if it is free and pumps.
  bool HeldByFloor(const ItemResult& r) EPD_REQUIRES(mu_);
  void FloorElapsed();
  // Asks the request budget for message_bytes_ by admit_by_ (admission.h);
  // Admitted gets the answer, and submits or finishes the call. Both hold
  // the writer role (Start's).
  void Admit();
  void Admitted(const Status& st);
  void Submit();
  void Deliver(const ItemResult& r);  // the worker's on_item
  void Done(const RequestResult& r);  // the worker's on_done
  // With the writer role: writes the next item, finishes the call, or gives
  // the role back when there is nothing to do yet.
  void Pump();
  // Pump() from the worker thread or a gRPC reaction: right there when
  // every payload goes by reference (shared memory, CUDA IPC), else on the
  // pool, so that neither copies rows into an inline reply.
  void PumpOrPost();
  // Finishes the call with `s` and no (further) write. REQUIRES: the writer
  // role, or the call was never handed to the worker.
  void FinishWith(const Status& s);
  // The call's latency, into the Encode histogram; once, as it finishes.
  void ObserveDuration();
  Status FinalStatus() const EPD_REQUIRES(mu_);  // REQUIRES: done_

  EncodeServer::Impl& server_;
  grpc::CallbackServerContext* const ctx_;
  const v1::EncodeRequest* const req_;  // gRPC's; valid until OnDone
  const Clock::time_point start_;
  std::shared_ptr<EncodeCall> self_;  // gRPC's reference, until OnDone

  // Set by Start, before another thread sees the call.
  Clock::time_point admit_by_;
  // A cancel this close to the deadline counts as the deadline (encode_call.cc).
  std::chrono::system_clock::duration deadline_slack_{std::chrono::milliseconds(5)};
  std::int64_t message_bytes_ = 0;
  std::string id_, tenant_;        // tenant_: the fair-order share (caller_.share)
  internal::Caller caller_;        // who calls (tenants.h), from Start
  WorkerLoop::Ticket ticket_ = 0;  // set by Submit before another thread sees it
  std::size_t n_ = 0;
  bool by_ipc_ = false;
  std::uint64_t ipc_owner_ = 0;  // the call's session's owner in the CUDA IPC leases, 0 = none
  bool references_ = false;      // payloads go by reference: cheap to build on any thread
  std::function<bool(const Embedding&, v1::EncodedItem*)> place_payload_;

  v1::EncodedItem msg_;                     // the write in flight (writer role)
  std::int64_t msg_bytes_ = 0;              // its item's buffered bytes (writer role; OnDone for the last write)
  std::int64_t msg_held_ = 0;               // what it holds in the reply budget (likewise)
  internal::ReplyBudget::Account account_;  // set by Start once the tenant is known; closed in OnDone
  std::string connection_;                  // the call's peer (its connection), from Start
  // OnDone has begun: ctx_ may be gone. Guards ctx_->TryCancel from the
  // write timer; recursive because gRPC may run OnDone inside TryCancel.
  std::recursive_mutex ctx_mu_;
  bool ctx_done_ = false;  // guarded by ctx_mu_ (a std::recursive_mutex, which no annotation names)

  Mutex mu_;
  bool writer_ = true;                            // Start holds the role until the request is submitted
  bool admitting_ = false;                        // waiting for the budget's answer (Admit to Admitted)
  internal::RequestBudget::WaiterId waiter_ = 0;  // its waiter, once queued (0 = none or not yet known)
  bool admitted_ = false;                         // message_bytes_ of the budget are held
  bool submitted_ = false;                        // the worker has the request
  bool finished_ = false;                         // Finish or StartWriteAndFinish called
  bool done_ = false;                             // on_done fired
  Status request_status_;                         // RequestResult::status, valid once done_
  Status give_up_;                                // cancelled, past the deadline, or the client went away
  std::deque<ItemResult> ready_;                  // delivered, not yet written
  bool throttled_ = false;                        // counted once as throttled (its tenant past its share)
  bool in_transport_ = false;                     // a write is handed to gRPC and not completed
  bool final_ok_ = false;                         // the last write went out with an OK status
  bool timer_armed_ = false;                      // a CheckWriteProgress is posted (write_timer_)
  internal::TaskPool::TaskId write_timer_;        // cancelled by OnDone, so no finished call waits on the pool
  bool call_done_ = false;                        // OnDone has run: arm no timer
  bool floor_armed_ EPD_GUARDED_BY(mu_) = false;  // a FloorElapsed is posted (floor_timer_)
  internal::TaskPool::TaskId floor_timer_;        // cancelled by OnDone
  Clock::time_point write_started_;               // when the write in transport was handed over
  std::size_t delivered_ = 0, written_ = 0, failed_ = 0;
  std::int64_t first_failed_ = -1;
  Status first_failure_;
};

}  // namespace epd
