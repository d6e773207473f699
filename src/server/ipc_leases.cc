#include "ipc_leases.h"

#include <utility>
#include <vector>

namespace epd::internal {

StatusOr<std::unique_ptr<IpcLeases>> IpcLeases::Create(Device* device, std::int64_t capacity_bytes,
                                                       std::chrono::milliseconds lease,
                                                       std::function<Clock::time_point()> now) {
  if (device == nullptr) return InvalidArgument("CUDA IPC delivery needs a device (ipc_device is null)");
  if (capacity_bytes <= 0) {
    return InvalidArgument("ipc_export_bytes must be > 0 for CUDA IPC delivery, got " + std::to_string(capacity_bytes));
  }
  if (lease.count() <= 0)
    return InvalidArgument("the CUDA IPC lease must be > 0 ms, got " + std::to_string(lease.count()));
  std::unique_ptr<IpcLeases> l(new IpcLeases(lease));
  l->device_ = device;
  l->capacity_ = static_cast<std::uint64_t>(capacity_bytes);
  l->now_ = std::move(now);
  MutexLock lock(l->mu_);  // not shared yet: for the analysis, at no cost
  l->stats_.capacity_bytes = capacity_bytes;
  return l;
}

IpcLeases::~IpcLeases() = default;

void IpcLeases::UnrefLocked(std::uint64_t id, Dead* dead) {
  auto e = exports_.find(id);
  if (e == exports_.end()) return;  // cannot happen: an export lives while leased
  if (--e->second.refs > 0) return;
  stats_.exported_bytes -= static_cast<std::int64_t>(e->second.bytes);
  --stats_.exports;
  if (!e->second.key.empty()) by_key_.erase(e->second.key);
  dead->push_back(std::move(e->second.exported));
  exports_.erase(e);
}

void IpcLeases::SweepLocked(Clock::time_point now, Dead* dead) {
  while (std::optional<std::uint64_t> id = book_.ExpireNext(now)) UnrefLocked(*id, dead);
}

std::optional<IpcLeases::Lease> IpcLeases::Acquire(const std::string& key, const void* device_src, std::uint64_t bytes,
                                                   Status* export_error) {
  Dead dead;  // destroyed after the lock is dropped
  std::optional<Lease> out;
  {
    MutexLock lock(mu_);
    const Clock::time_point now = Now();
    SweepLocked(now, &dead);
    auto it = exports_.end();
    if (!key.empty()) {
      if (auto hit = by_key_.find(key); hit != by_key_.end()) it = exports_.find(hit->second);
    }
    const bool reused = it != exports_.end();
    if (!reused) {
      if (bytes > capacity_ || static_cast<std::uint64_t>(stats_.exported_bytes) > capacity_ - bytes) {
        // Past the bound: nothing exported, the caller falls back.
      } else {
        StatusOr<std::unique_ptr<IpcExport>> exported = device_->ExportIpc(device_src, bytes);
        if (!exported.ok()) {
          if (export_error != nullptr) *export_error = exported.status();
        } else {
          const std::uint64_t id = next_export_id_++;
          it = exports_.emplace(id, ExportState{std::move(*exported), bytes, 0, key}).first;
          if (!key.empty()) by_key_.emplace(key, id);
          stats_.exported_bytes += static_cast<std::int64_t>(bytes);
          ++stats_.exports;
        }
      }
    }
    if (it != exports_.end()) {
      ++it->second.refs;
      const std::uint64_t generation = book_.Grant(it->first, now);
      out = Lease{it->second.exported->handle(), generation, reused};
    }
  }
  return out;
}

Status IpcLeases::Release(std::uint64_t generation) {
  Dead dead;
  Status s = Status::Ok();
  {
    MutexLock lock(mu_);
    SweepLocked(Now(), &dead);
    const LeaseBook::Released r = book_.Release(generation);
    if (!r.ok()) {
      s = FailedPrecondition("no CUDA IPC lease with generation " + std::to_string(generation) +
                             " (released already, expired, or never handed out)");
    } else {
      UnrefLocked(r.holding, &dead);
    }
  }
  return s;
}

std::uint64_t IpcLeases::OpenOwner() {
  MutexLock lock(mu_);
  return book_.OpenOwner();
}

bool IpcLeases::Adopt(std::uint64_t generation, std::uint64_t owner) {
  Dead dead;
  MutexLock lock(mu_);
  SweepLocked(Now(), &dead);
  return book_.Adopt(generation, owner);
}

std::size_t IpcLeases::ReleaseOwner(std::uint64_t owner) {
  Dead dead;
  MutexLock lock(mu_);
  SweepLocked(Now(), &dead);
  const std::vector<std::uint64_t> ids = book_.ReleaseOwner(owner);
  for (const std::uint64_t id : ids) UnrefLocked(id, &dead);
  return ids.size();
}

void IpcLeases::CountFallback(bool not_resident) {
  MutexLock lock(mu_);
  ++(not_resident ? stats_.not_resident : stats_.fallbacks);
}

void IpcLeases::CountItem(bool reused) {
  MutexLock lock(mu_);
  ++stats_.items;
  if (reused) ++stats_.reused;
}

IpcStats IpcLeases::Stats() {
  Dead dead;
  MutexLock lock(mu_);
  SweepLocked(Now(), &dead);
  IpcStats s = stats_;
  CopyLeaseCounts(book_.counts(), &s);
  return s;
}

}  // namespace epd::internal
