// src/server/ipc_leases.h (internal to epd::server): the leases behind
// DELIVERY_CUDA_IPC (docs/SHM.md, "CUDA IPC").
//
// An item's device-resident rows are exported once per content key with
// Device::ExportIpc (a private device copy plus an interprocess event), and
// every reply that delivers the key while that export lives leases the same
// export, as ShmArena shares a span. Each lease has its own generation,
// unique for the life of the server, and ends when the client releases it,
// when its deadline passes, or when the lease session it was put under ends
// (Adopt, ReleaseOwner; shm_session.h). When a key's last lease ends, its
// export is destroyed at once (its device copy freed): unlike the arena's
// idle spans, an idle export would hold device memory outside the GPU
// tier's capacity for nothing but a faster next hit, so none is kept. Bytes of live exports are
// bounded by `capacity_bytes`: an export that would pass it is refused, and
// the caller falls back (shared memory or inline bytes) and counts it.
//
// The leases themselves (generations, the deadline FIFO, owners) are kept by
// a LeaseBook (lease_book.h), each holding its export's id; expired leases
// are swept at the start of every Acquire, Release, Adopt, ReleaseOwner and
// Stats.
//
// Complexity: Acquire of a key with a live export O(1 + e); of a new key one
// ExportIpc (a device-to-device copy and an allocation) plus O(1 + e);
// Release and Adopt O(1 + e); OpenOwner O(1); ReleaseOwner O(k + e) for
// the owner's k live leases; e leases that expire in the sweep.
// Thread safety: thread-safe (one mutex, held across ExportIpc so a key is
// exported once; ExportIpc only enqueues its copy). Destroying an export
// (ending its last lease) happens outside the mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/gpu/device.h"
#include "epd/rpc/server_stats.h"
#include "lease_book.h"

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

  // Lease sessions, as ShmArena's (shm_session.h). OpenOwner: a new owner (a
  // nonzero tag, never reused), live until ReleaseOwner. Adopt: puts the
  // live lease `generation` under the live `owner`; false, and nothing
  // changes, when the owner was never opened or is released already, or the
  // lease has ended or is under an owner already. ReleaseOwner: ends every
  // lease still under `owner`, as Release would (an export whose last lease
  // it was is destroyed, outside the mutex), counted in
  // IpcStats::session_reclaimed (not `released`), and retires the owner;
  // returns how many leases it ended, 0 for an owner that is unknown or
  // released already (harmless to repeat).
  std::uint64_t OpenOwner();
  bool Adopt(std::uint64_t generation, std::uint64_t owner);
  std::size_t ReleaseOwner(std::uint64_t owner);

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
    std::int64_t refs = 0;  // live leases on it
    std::string key;        // empty: never shared (not in by_key_)
  };
  using Dead = std::vector<std::shared_ptr<IpcExport>>;

  explicit IpcLeases(std::chrono::milliseconds lease) : lease_(lease), book_(lease) {}
  Clock::time_point Now() const { return now_ ? now_() : Clock::now(); }
  // One lease fewer on the export `id`; the last one ends the export, which
  // goes to *dead (destroyed by the caller once the mutex is dropped).
  void UnrefLocked(std::uint64_t id, Dead* dead) EPD_REQUIRES(mu_);
  void SweepLocked(Clock::time_point now, Dead* dead) EPD_REQUIRES(mu_);

  Device* device_ = nullptr;
  std::uint64_t capacity_ = 0;
  std::chrono::milliseconds lease_{0};
  std::function<Clock::time_point()> now_;

  Mutex mu_;
  std::unordered_map<std::uint64_t, ExportState> exports_ EPD_GUARDED_BY(mu_);  // live exports by id
  std::unordered_map<std::string, std::uint64_t> by_key_ EPD_GUARDED_BY(mu_);   // key -> id, nonempty keys
  std::uint64_t next_export_id_ EPD_GUARDED_BY(mu_) = 1;
  LeaseBook book_ EPD_GUARDED_BY(mu_);  // each lease holds its export's id
  // The exports' own counters; the lease counts come from book_ in Stats.
  IpcStats stats_ EPD_GUARDED_BY(mu_);
};

}  // namespace epd::internal
