// src/server/ipc_leases.h (internal to epd::server): the leases behind
// DELIVERY_CUDA_IPC (docs/SHM.md, "CUDA IPC").
//
// An item's device-resident rows are exported once per content key with
// Device::ExportIpc (a private device copy plus an interprocess event), and
// every reply that delivers the key while that export lives leases the same
// export, as ShmArena shares a span. Each lease has its own generation,
// unique for the life of the server, and ends when the client releases it or
// its deadline passes. When a key's last lease ends, its export is destroyed
// at once (its device copy freed): unlike the arena's idle spans, an idle
// export would hold device memory outside the GPU tier's capacity for
// nothing but a faster next hit, so none is kept. Bytes of live exports are
// bounded by `capacity_bytes`: an export that would pass it is refused, and
// the caller falls back (shared memory or inline bytes) and counts it.
//
// Expiry: a FIFO of (deadline, generation), sorted because the lease time is
// one constant; entries of leases released earlier are skipped. Expired
// leases are swept at the start of every Acquire, Release and Stats.
//
// Complexity: Acquire of a key with a live export O(1 + e); of a new key one
// ExportIpc (a device-to-device copy and an allocation) plus O(1 + e);
// Release O(1 + e); e leases that expire in the sweep.
// Thread safety: thread-safe (one mutex, held across ExportIpc so a key is
// exported once; ExportIpc only enqueues its copy). Destroying an export
// (ending its last lease) happens outside the mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "epd/device.h"
#include "epd/server_stats.h"
#include "epd/status.h"

namespace epd::internal {

class IpcLeases {
 public:
  using Clock = std::chrono::steady_clock;

  struct Lease {
    IpcHandle handle;
    std::uint64_t generation = 0;
    bool reused = false;  // the key's export was live already (no copy)
  };

  // `device` exports the rows (not owned; outlives this). `capacity_bytes`
  // bounds the bytes of live exports; `lease` is how long a lease lasts
  // without a release; `now` replaces the steady clock (tests).
  // kInvalidArgument for a null device, a capacity <= 0 or a lease <= 0.
  static StatusOr<std::unique_ptr<IpcLeases>> Create(Device* device, std::int64_t capacity_bytes,
                                                     std::chrono::milliseconds lease,
                                                     std::function<Clock::time_point()> now = nullptr);
  ~IpcLeases();
  IpcLeases(const IpcLeases&) = delete;
  IpcLeases& operator=(const IpcLeases&) = delete;

  // A lease, until now + lease, on the export of `key`'s rows: `bytes` of
  // device memory at `device_src` (REQUIRES: the copies into them have
  // landed). An empty key is never shared. nullopt when a new export would
  // pass the bound, or when ExportIpc fails (`*export_error` gets its status
  // when non-null); nothing is counted here (the caller counts the
  // fallback). REQUIRES: every call with the same key passes the same rows.
  std::optional<Lease> Acquire(const std::string& key, const void* device_src, std::uint64_t bytes,
                               Status* export_error = nullptr);

  // Ends the lease `generation`. kFailedPrecondition otherwise (released
  // already, expired, or never handed out), counted in
  // IpcStats::refused_releases; nothing changes.
  Status Release(std::uint64_t generation);

  // An item the caller asked to send by CUDA IPC but sent otherwise:
  // `not_resident` for rows outside device memory, else the bound or a
  // failed export.
  void CountFallback(bool not_resident);
  // An item sent by CUDA IPC (`reused`: from a live export).
  void CountItem(bool reused);

  IpcStats Stats();

  Device& device() const { return *device_; }
  std::chrono::milliseconds lease() const { return lease_; }

 private:
  struct ExportState {
    std::shared_ptr<IpcExport> exported;
    std::uint64_t bytes = 0;
    std::int64_t refs = 0;
  };
  struct LeaseState {
    std::string key;  // the export's key in exports_ (a private one for an empty key)
  };
  struct Expiry {
    Clock::time_point deadline;
    std::uint64_t generation = 0;
  };

  IpcLeases() = default;
  Clock::time_point Now() const { return now_ ? now_() : Clock::now(); }
  // Ends the lease `it`; the export it drops (its last lease) goes to *dead.
  void EndLocked(std::unordered_map<std::uint64_t, LeaseState>::iterator it,
                 std::vector<std::shared_ptr<IpcExport>>* dead);
  void SweepLocked(Clock::time_point now, std::vector<std::shared_ptr<IpcExport>>* dead);

  Device* device_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::chrono::milliseconds lease_{0};
  std::function<Clock::time_point()> now_;

  std::mutex mu_;
  std::unordered_map<std::string, ExportState> exports_;    // guarded by mu_
  std::unordered_map<std::uint64_t, LeaseState> leases_;    // by generation; guarded by mu_
  std::deque<Expiry> expiry_;                               // guarded by mu_
  std::uint64_t next_generation_ = 1;                       // guarded by mu_
  std::uint64_t next_private_key_ = 1;                      // guarded by mu_
  IpcStats stats_;                                          // guarded by mu_
};

}  // namespace epd::internal
