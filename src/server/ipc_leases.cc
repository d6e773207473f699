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
  if (lease.count() <= 0) return InvalidArgument("the CUDA IPC lease must be > 0 ms, got " + std::to_string(lease.count()));
  std::unique_ptr<IpcLeases> l(new IpcLeases());
  l->device_ = device;
  l->capacity_ = static_cast<std::uint64_t>(capacity_bytes);
  l->lease_ = lease;
  l->now_ = std::move(now);
  l->stats_.capacity_bytes = capacity_bytes;
  return l;
}

IpcLeases::~IpcLeases() = default;

void IpcLeases::EndLocked(std::unordered_map<std::uint64_t, LeaseState>::iterator it,
                          std::vector<std::shared_ptr<IpcExport>>* dead) {
  auto e = exports_.find(it->second.key);
  leases_.erase(it);
  --stats_.leases;
  if (e == exports_.end()) return;  // cannot happen: an export lives while leased
  if (--e->second.refs > 0) return;
  stats_.exported_bytes -= static_cast<std::int64_t>(e->second.bytes);
  --stats_.exports;
  dead->push_back(std::move(e->second.exported));
  exports_.erase(e);
}

void IpcLeases::SweepLocked(Clock::time_point now, std::vector<std::shared_ptr<IpcExport>>* dead) {
  while (!expiry_.empty() && expiry_.front().deadline <= now) {
    auto it = leases_.find(expiry_.front().generation);
    expiry_.pop_front();
    if (it == leases_.end()) continue;  // released before its deadline
    EndLocked(it, dead);
    ++stats_.expired;
  }
}

std::optional<IpcLeases::Lease> IpcLeases::Acquire(const std::string& key, const void* device_src,
                                                   std::uint64_t bytes, Status* export_error) {
  std::vector<std::shared_ptr<IpcExport>> dead;  // destroyed after the lock is dropped
  std::optional<Lease> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Now();
    SweepLocked(now, &dead);
    std::string slot = key.empty() ? "#private-" + std::to_string(next_private_key_++) : key;
    auto it = exports_.find(slot);
    bool reused = it != exports_.end();
    if (!reused) {
      if (bytes > capacity_ || static_cast<std::uint64_t>(stats_.exported_bytes) > capacity_ - bytes) {
        // Past the bound: nothing exported, the caller falls back.
      } else {
        StatusOr<std::unique_ptr<IpcExport>> exported = device_->ExportIpc(device_src, bytes);
        if (!exported.ok()) {
          if (export_error != nullptr) *export_error = exported.status();
        } else {
          ExportState st;
          st.exported = std::move(*exported);
          st.bytes = bytes;
          it = exports_.emplace(slot, std::move(st)).first;
          stats_.exported_bytes += static_cast<std::int64_t>(bytes);
          ++stats_.exports;
        }
      }
    }
    if (it != exports_.end()) {
      ++it->second.refs;
      const std::uint64_t generation = next_generation_++;
      leases_.emplace(generation, LeaseState{slot});
      expiry_.push_back(Expiry{now + lease_, generation});
      ++stats_.leases;
      out = Lease{it->second.exported->handle(), generation, reused};
    }
  }
  return out;
}

Status IpcLeases::Release(std::uint64_t generation) {
  std::vector<std::shared_ptr<IpcExport>> dead;
  Status s = Status::Ok();
  {
    std::lock_guard<std::mutex> lock(mu_);
    SweepLocked(Now(), &dead);
    auto it = leases_.find(generation);
    if (it == leases_.end()) {
      ++stats_.refused_releases;
      s = FailedPrecondition("no CUDA IPC lease with generation " + std::to_string(generation) +
                             " (released already, expired, or never handed out)");
    } else {
      EndLocked(it, &dead);
      ++stats_.released;
    }
  }
  return s;
}

void IpcLeases::CountFallback(bool not_resident) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(not_resident ? stats_.not_resident : stats_.fallbacks);
}

void IpcLeases::CountItem(bool reused) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.items;
  if (reused) ++stats_.reused;
}

IpcStats IpcLeases::Stats() {
  std::vector<std::shared_ptr<IpcExport>> dead;
  std::lock_guard<std::mutex> lock(mu_);
  SweepLocked(Now(), &dead);
  return stats_;
}

}  // namespace epd::internal
