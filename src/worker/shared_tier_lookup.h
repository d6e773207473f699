// src/worker/shared_tier_lookup.h (internal to epd::worker): the threads on
// which WorkerLoop asks the shared tier (L3) about keys its L1/L2 miss, and
// waits on other processes' leases, so the worker thread never blocks on the
// network (SharedTierLookup); and WorkerLoop's parking of the requests that
// wait for them, with the write-back of tower results (SharedTierParking,
// at the end).
//
// A lookup of one key (Run below):
//   1. Get: a valid value ends it (the item is served as an L3 hit).
//   2. Without single flight, or when the tier errs: ends it with no value
//      (the item is encoded here).
//   3. TryLease. kAcquired: Get once more (the holder before us may have
//      written its value and released its lease between our Get and our SET
//      NX), and end with that value (releasing the lease) or none (we encode
//      and our write releases it). kHeldByUs / kError: end with none.
//      kHeldByOther: wait, i.e. reschedule the lookup after a backoff
//      (poll_initial doubling to poll_max) and go back to 1; so when the
//      holder's lease lapses without a value (it crashed), step 3 takes it
//      over. After LeaseWaitPolicy::wait, or when the request is cancelled,
//      end with none.
// Waiting holds no thread: a waiting lookup sits in a queue ordered by when
// it is due, and lookup_threads threads run whatever is due.
// One lookup per key at a time: a key asked for again while its lookup runs
// (another request of this process) follows that lookup and gets its value,
// so N requests for one new key cost one GET, not N. A follower whose
// request is cancelled still ends with its leader. A value found stays here
// for kRecentFor after its lookup ends (at most kRecentMax keys): until the
// worker has put it into L1, further requests for the key still miss
// locally and come here, and they get it without another GET.
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "epd/core/encode_types.h"
#include "epd/core/mutex.h"
#include "epd/core/shared_tier.h"
#include "epd/worker/encode_request.h"

namespace epd::internal {

// The keys of one request that L1/L2 missed, and what the tier gave for
// each. `done` runs exactly once, on a lookup thread (or in Stop), after every
// key has ended; values[i] is then the value for keys[i] or null, and
// seconds[i] the encode cost stored with it (-1: none).
struct LookupBatch {
  std::vector<ContentKey> keys;
  std::vector<EmbeddingPtr> values;
  std::vector<double> seconds;
  std::atomic<bool> cancelled{false};  // set by the caller: end waits at once
  std::function<void()> done;
  std::atomic<std::size_t> remaining{0};
};

class SharedTierLookup {
 public:
  explicit SharedTierLookup(std::shared_ptr<SharedTier> tier);
  ~SharedTierLookup();  // Stop()

  // Starts the lookups of `batch` (its values are sized here). False, and
  // nothing started, once Stop has begun.
  bool Submit(const std::shared_ptr<LookupBatch>& batch);
  // Ends every lookup now (without a value), runs the `done`s still due, and
  // joins the threads. Idempotent.
  void Stop();

  // The tier's counters plus the waits counted here.
  SharedTierStats Stats() const;
  SharedTier& tier() const { return *tier_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Task {
    std::shared_ptr<LookupBatch> batch;
    std::size_t index = 0;
    Clock::time_point due;
    std::uint64_t seq = 0;  // FIFO among equally due tasks
    bool waited = false;
    Clock::time_point wait_start;
    std::chrono::milliseconds backoff{0};
  };
  struct Later {
    bool operator()(const Task& a, const Task& b) const { return a.due != b.due ? a.due > b.due : a.seq > b.seq; }
  };

  void Loop();
  // One step of the key's lookup; true when it ended (value set or not).
  bool Run(Task& t);
  // `seconds`: the cost stored with `value` (-1: none).
  void End(Task& t, EmbeddingPtr value, double seconds = -1);
  // Drops lately found values past their deadline, and the oldest beyond
  // kRecentMax.
  void ForgetRecentLocked(Clock::time_point now) EPD_REQUIRES(mu_);

  // Ends one key of `batch` with `value`; runs `done` when it was the last.
  static void Settle(LookupBatch& batch, std::size_t index, EmbeddingPtr value, double seconds);

  const std::shared_ptr<SharedTier> tier_;
  const LeaseWaitPolicy policy_;

  mutable Mutex mu_;
  CondVar cv_;
  std::priority_queue<Task, std::vector<Task>, Later> queue_ EPD_GUARDED_BY(mu_);
  std::uint64_t next_seq_ EPD_GUARDED_BY(mu_) = 0;
  bool stopping_ EPD_GUARDED_BY(mu_) = false;
  // Keys with a lookup running -> the (batch, index) waiting on it besides
  // the leader's own.
  std::map<ContentKey, std::vector<std::pair<std::shared_ptr<LookupBatch>, std::size_t>>> leaders_ EPD_GUARDED_BY(mu_);
  // Values found lately (see the header comment), and their deadlines in
  // the order they were found (one constant lifetime, so the FIFO is sorted).
  static constexpr std::chrono::milliseconds kRecentFor{1000};
  static constexpr std::size_t kRecentMax = 256;
  struct Recent {
    EmbeddingPtr value;
    double seconds = -1;
    Clock::time_point until;
  };
  std::map<ContentKey, Recent> recent_ EPD_GUARDED_BY(mu_);
  std::deque<std::pair<Clock::time_point, ContentKey>> recent_fifo_ EPD_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;

  std::atomic<std::uint64_t> lease_waits_{0}, lease_wait_hits_{0}, lease_takeovers_{0}, lease_wait_timeouts_{0};
};

// WorkerLoop's side of the shared tier (epd/worker/worker_loop.h, "Shared
// tier"): a request with image keys found nowhere locally is parked while
// SharedTierLookup asks the tier about them, and comes back with the values
// found; tower results are written back and leases released.
//
// Ordering with Cancel: a parked request comes back (Resume) and a Cancel
// marks it (Cancel) under one mutex, and each runs its follow-up (pushing
// into WorkerLoop's inbox) under it too, so a cancel either reaches the
// parked request as its `cancelled` flag or is queued after it comes back.
// Lock order: this mutex, then WorkerLoop's.
//
// Thread safety: thread-safe.
class SharedTierParking {
 public:
  explicit SharedTierParking(std::shared_ptr<SharedTier> tier) : tier_(tier), lookup_(std::move(tier)) {}

  enum class Outcome {
    kLocal,      // nothing to look up (or the lookups are stopping): submit it now
    kParked,     // `resume` runs exactly once, when every lookup has ended
    kDuplicate,  // a request with this id is parked: refuse it (AlreadyInFlight)
  };
  // What comes back: per item, the value found (null: none, or not looked
  // up) and the encode cost stored with it (-1: none), and whether a Cancel
  // reached it while parked. Runs under this parking's mutex, on a lookup
  // thread or inside Stop.
  using Resume = std::function<void(std::vector<EmbeddingPtr> ready, std::vector<double> seconds, bool cancelled)>;
  // Looks up the image keys of `request` that are ok, carry no ready value
  // and are not `local` (videos stay local: their whole-video value carries
  // sampling timestamps the tier does not hold, and their chunk keys exist
  // only after the decode; docs/L3.md), each key once.
  Outcome Park(const EncodeRequest& request, const std::vector<StatusOr<ContentKey>>& keys, std::uint64_t ticket,
               const std::function<bool(const ContentKey&)>& local, Resume resume);
  // A cancel of `id` (only the submission `ticket` when non-zero): a parked
  // request's waits end and it comes back cancelled. `then` runs under the
  // mutex either way.
  void Cancel(const std::string& id, std::uint64_t ticket, const std::function<void()>& then);

  // `callbacks` wrapped so that a tower result (ItemSource::kMiss, not a
  // video) is written to the tier, which releases this process's lease, and
  // a failed or undelivered miss releases it at once.
  RequestCallbacks WithWriteBack(RequestCallbacks callbacks) const;
  // The worker refused the value the tier gave for `key` (its adoption
  // check, `why`): SharedTier::RejectAsync deletes it there. Never blocks.
  void Reject(const ContentKey& key, const std::string& why) const { tier_->RejectAsync(key, why); }

  // Ends every lookup (parked requests come back with what was found) and
  // joins the lookup threads. Idempotent.
  void Stop() { lookup_.Stop(); }
  SharedTierStats Stats() const { return lookup_.Stats(); }

 private:
  struct Parked {
    std::uint64_t ticket = 0;
    std::shared_ptr<LookupBatch> batch;
  };
  const std::shared_ptr<SharedTier> tier_;  // kept alive by the write-back callbacks too
  Mutex mu_;
  std::map<std::string, Parked> parked_ EPD_GUARDED_BY(mu_);
  SharedTierLookup lookup_;  // last: its threads run `done`s that use mu_
};

}  // namespace epd::internal
