// SharedTierLookup (shared_tier_lookup.h). The queue holds every unfinished
// lookup, due now or later; a thread takes the earliest due one, runs one
// step outside the lock and either ends it or puts it back with a later due
// time. Stop() flips `stopping_`, after which every step ends its lookup at
// once, so the threads drain the queue quickly and exit.
#include "shared_tier_lookup.h"

#include <algorithm>

namespace epd::internal {

SharedTierLookup::SharedTierLookup(std::shared_ptr<SharedTier> tier)
    : tier_(std::move(tier)), policy_(tier_->wait_policy()) {
  const int n = std::max(1, policy_.lookup_threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
}

SharedTierLookup::~SharedTierLookup() { Stop(); }

bool SharedTierLookup::Submit(const std::shared_ptr<LookupBatch>& batch) {
  std::vector<std::pair<std::size_t, Recent>> found;  // settled below, outside mu_
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    batch->values.assign(batch->keys.size(), nullptr);
    batch->seconds.assign(batch->keys.size(), -1);
    batch->remaining = batch->keys.size();
    const Clock::time_point now = Clock::now();
    ForgetRecentLocked(now);
    for (std::size_t i = 0; i < batch->keys.size(); ++i) {
      if (auto r = recent_.find(batch->keys[i]); r != recent_.end()) {
        found.emplace_back(i, r->second);
        continue;
      }
      auto [leader, fresh] = leaders_.try_emplace(batch->keys[i]);
      if (!fresh) {
        leader->second.emplace_back(batch, i);
        continue;
      }
      Task t;
      t.batch = batch;
      t.index = i;
      t.due = now;
      t.seq = next_seq_++;
      queue_.push(std::move(t));
    }
    cv_.NotifyAll();
  }
  // Outside mu_: the last Settle runs `done`, which takes the WorkerLoop's lock.
  for (auto& [i, recent] : found) Settle(*batch, i, std::move(recent.value), recent.seconds);
  return true;
}

void SharedTierLookup::ForgetRecentLocked(Clock::time_point now) {
  while (!recent_fifo_.empty() && (recent_fifo_.front().first <= now || recent_fifo_.size() > kRecentMax)) {
    auto it = recent_.find(recent_fifo_.front().second);
    // A key found again later has a later deadline and a later FIFO entry.
    if (it != recent_.end() && it->second.until == recent_fifo_.front().first) recent_.erase(it);
    recent_fifo_.pop_front();
  }
}

void SharedTierLookup::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

SharedTierStats SharedTierLookup::Stats() const {
  SharedTierStats s = tier_->Stats();
  s.lease_waits = lease_waits_.load();
  s.lease_wait_hits = lease_wait_hits_.load();
  s.lease_takeovers = lease_takeovers_.load();
  s.lease_wait_timeouts = lease_wait_timeouts_.load();
  return s;
}

void SharedTierLookup::Loop() {
  MutexLock lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (stopping_) return;
      cv_.Wait(mu_);
      continue;
    }
    // A stopping lookup is due at once: it only ends.
    // `due` is a copy: wait_until keeps reading its time point while the
    // lock is released, and a Submit meanwhile may grow the queue's vector
    // and free the element a reference would point into (found by ASan).
    if (const Clock::time_point due = queue_.top().due; !stopping_ && due > Clock::now()) {
      cv_.WaitUntil(mu_, due);
      continue;
    }
    Task t = queue_.top();
    queue_.pop();
    const bool stopping = stopping_;
    lock.Unlock();
    bool ended = true;
    if (stopping || t.batch->cancelled.load()) {
      End(t, nullptr);
    } else {
      ended = Run(t);
    }
    lock.Lock();
    if (!ended) {
      t.seq = next_seq_++;
      queue_.push(std::move(t));
    }
  }
}

bool SharedTierLookup::Run(Task& t) {
  const ContentKey& key = t.batch->keys[t.index];
  double seconds = -1;
  StatusOr<EmbeddingPtr> got = tier_->Get(key, &seconds);
  if (!got.ok()) {
    End(t, nullptr);
    return true;
  }
  if (*got != nullptr) {
    if (t.waited) ++lease_wait_hits_;
    End(t, *std::move(got), seconds);
    return true;
  }
  if (!policy_.single_flight) {
    End(t, nullptr);
    return true;
  }
  switch (tier_->TryLease(key)) {
    case LeaseResult::kAcquired: {
      StatusOr<EmbeddingPtr> again = tier_->Get(key, &seconds);
      if (again.ok() && *again != nullptr) {
        tier_->ReleaseAsync(key);
        if (t.waited) ++lease_wait_hits_;
        End(t, *std::move(again), seconds);
        return true;
      }
      if (t.waited) ++lease_takeovers_;
      End(t, nullptr);
      return true;
    }
    case LeaseResult::kHeldByUs:
    case LeaseResult::kError:
      End(t, nullptr);
      return true;
    case LeaseResult::kHeldByOther:
      break;
  }
  const Clock::time_point now = Clock::now();
  if (!t.waited) {
    t.waited = true;
    t.wait_start = now;
    t.backoff = policy_.poll_initial;
    ++lease_waits_;
  } else {
    t.backoff = std::min(t.backoff * 2, policy_.poll_max);
  }
  if (now - t.wait_start >= policy_.wait) {
    ++lease_wait_timeouts_;
    End(t, nullptr);
    return true;
  }
  t.due = std::min(now + t.backoff, t.wait_start + policy_.wait);
  return false;
}

void SharedTierLookup::End(Task& t, EmbeddingPtr value, double seconds) {
  std::vector<std::pair<std::shared_ptr<LookupBatch>, std::size_t>> followers;
  {
    MutexLock lock(mu_);
    auto it = leaders_.find(t.batch->keys[t.index]);
    if (it != leaders_.end()) {
      followers = std::move(it->second);
      leaders_.erase(it);
    }
    if (value != nullptr) {
      const Clock::time_point now = Clock::now();
      recent_[t.batch->keys[t.index]] = Recent{value, seconds, now + kRecentFor};
      recent_fifo_.emplace_back(now + kRecentFor, t.batch->keys[t.index]);
      ForgetRecentLocked(now);
    }
  }
  // Outside mu_: `done` takes the WorkerLoop's lock.
  for (auto& [batch, index] : followers) Settle(*batch, index, value, seconds);
  Settle(*t.batch, t.index, std::move(value), seconds);
}

void SharedTierLookup::Settle(LookupBatch& batch, std::size_t index, EmbeddingPtr value, double seconds) {
  batch.values[index] = std::move(value);
  batch.seconds[index] = seconds;
  if (batch.remaining.fetch_sub(1) == 1 && batch.done) batch.done();
}

SharedTierParking::Outcome SharedTierParking::Park(const EncodeRequest& request,
                                                   const std::vector<StatusOr<ContentKey>>& keys, std::uint64_t ticket,
                                                   const std::function<bool(const ContentKey&)>& local, Resume resume) {
  // The keys no local tier can serve, each once, and the items they belong to.
  std::vector<ContentKey> wanted;
  std::vector<std::pair<std::size_t, std::size_t>> item_key;  // (item, index into wanted)
  for (std::size_t i = 0; i < keys.size() && i < request.items.size(); ++i) {
    const EncodeItemInput& item = request.items[i];
    if (item.is_video() || !keys[i].ok() || local(*keys[i])) continue;
    auto k = std::find(wanted.begin(), wanted.end(), *keys[i]);
    if (k == wanted.end()) k = wanted.insert(k, *keys[i]);
    item_key.emplace_back(i, static_cast<std::size_t>(k - wanted.begin()));
  }
  if (wanted.empty()) return Outcome::kLocal;
  auto batch = std::make_shared<LookupBatch>();
  batch->keys = std::move(wanted);
  LookupBatch* b = batch.get();  // the lookup's tasks own `batch` until `done` has run
  batch->done = [this, b, id = request.id, n = request.items.size(), item_key = std::move(item_key),
                 resume = std::move(resume)] {
    std::vector<EmbeddingPtr> ready(n);
    std::vector<double> seconds(n, -1);
    for (const auto& [item, k] : item_key) {
      ready[item] = b->values[k];
      seconds[item] = b->seconds[k];
    }
    MutexLock lock(mu_);
    parked_.erase(id);
    resume(std::move(ready), std::move(seconds), b->cancelled.load());
  };
  {
    MutexLock lock(mu_);
    if (!parked_.try_emplace(request.id, Parked{ticket, batch}).second) return Outcome::kDuplicate;
  }
  // Outside mu_: a key found lately settles inside Submit and runs `done`.
  if (!lookup_.Submit(batch)) {  // stopping: submit it as it is
    MutexLock lock(mu_);
    parked_.erase(request.id);
    return Outcome::kLocal;
  }
  return Outcome::kParked;
}

void SharedTierParking::Cancel(const std::string& id, std::uint64_t ticket, const std::function<void()>& then) {
  MutexLock lock(mu_);
  if (auto p = parked_.find(id); p != parked_.end() && (ticket == 0 || p->second.ticket == ticket)) {
    p->second.batch->cancelled = true;
  }
  then();
}

RequestCallbacks SharedTierParking::WithWriteBack(RequestCallbacks callbacks) const {
  std::shared_ptr<SharedTier> tier = tier_;
  auto user_item = std::move(callbacks.on_item);
  auto user_done = std::move(callbacks.on_done);
  return RequestCallbacks{[tier, user_item](const ItemResult& r) {
                            // A video is not looked up (Park), so it holds no lease and its
                            // value is not written either.
                            if (r.source == ItemSource::kMiss && r.video == nullptr) {
                              if (r.status.ok() && r.embedding != nullptr) {
                                // Releases our lease after the write.
                                tier->PutAsync(r.key, r.embedding, r.encode_seconds);
                              } else {
                                tier->ReleaseAsync(r.key);
                              }
                            }
                            if (user_item) user_item(r);
                          },
                          [tier, user_done](const RequestResult& r) {
                            // Items never delivered (cancelled): their leases, if ours.
                            for (const ItemResult& item : r.items) {
                              if (!item.status.ok()) tier->ReleaseAsync(item.key);
                            }
                            if (user_done) user_done(r);
                          }};
}

}  // namespace epd::internal
