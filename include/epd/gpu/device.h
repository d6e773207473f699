// epd/gpu/device.h: the accelerator as the cache tiers see it: memory, two copy
// streams, completion events and deferred release. No CUDA types appear here.
//
// A Device hands out two kinds of memory, both as move-only DeviceBuffers:
//   Allocate(bytes)            device memory (VRAM), for the L1 tier;
//   AllocatePinnedHost(bytes)  page-locked host memory from a fixed pool
//                              (epd/gpu/host_memory_pool.h), for the L2 tier.
// Copies are asynchronous and run on one of two dedicated streams, named as
// TensorRT-LLM's batch manager names host<->device moves:
//   Stream::kOnboard  host -> device (promotion, upload) and device -> device
//                     (adopting the tower's output rows into L1)
//   Stream::kOffload  device -> host (demotion, shipping)
// so a demotion never waits behind a promotion or the tower's work. Copies
// on one stream run in the order enqueued; the two streams are unordered
// with respect to each other unless StreamWaitEvent orders them.
//
// Events: RecordEvent(s) returns an Event that completes once every copy
// enqueued on s before it has landed. Query() never blocks; Synchronize()
// blocks. Ownership rule of the tiers: a copy's source and destination stay
// allocated until its event completes. ReleaseAfter(event, hold) implements
// it without blocking: the device keeps `hold` (any shared_ptr, e.g. the L1
// entry being offloaded) and drops it once the event has completed, at the
// next Poll() or the next Allocate/AllocatePinnedHost/RecordEvent. Holds are
// dropped outside the device's lock (they may free buffers and so re-enter).
//
// Implementations: FakeDevice (src/testing/fake_device.h, test-only; CPU memory, records every
// copy, completion driven by the test) and the CUDA device
// (epd/gpu_cuda/cuda_device.h; built with -DEPD_WITH_CUDA=ON).
//
// Errors: allocation beyond a capacity is kResourceExhausted (the tiers turn
// it into a dropped demotion or a promotion served from host memory); a
// failure the device reports (a CUDA error) is kInternal with its message.
//
// Lifetime: REQUIRES every DeviceBuffer and Event to be destroyed before
// their Device; a Device's destructor first waits for all pending holds.
// Thread safety: thread-safe. Any thread may allocate, copy, record, poll or
// free (a tier entry is freed where its last reader drops it).
//
// Example:
//   auto host = device.AllocatePinnedHost(n);
//   auto vram = device.Allocate(n);
//   device.CopyAsync(vram->data(), host->data(), n, CopyKind::kHostToDevice, Stream::kOnboard);
//   auto done = device.RecordEvent(Stream::kOnboard);
//   device.ReleaseAfter(*done, std::make_shared<DeviceBuffer>(std::move(*host)));
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "epd/core/mutex.h"
#include "epd/core/status.h"

namespace epd {

enum class MemoryKind : std::uint8_t { kDevice = 0, kPinnedHost = 1 };
// kDeviceToDevice: the worker copying a tower output's rows into an L1 entry.
enum class CopyKind : std::uint8_t { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2 };
enum class Stream : std::uint8_t { kOnboard = 0, kOffload = 1 };

// "device", "pinned_host"; "h2d", "d2h", "d2d"; "onboard", "offload".
std::string_view MemoryKindName(MemoryKind kind);
std::string_view CopyKindName(CopyKind kind);
std::string_view StreamName(Stream stream);

// Completion of a prefix of one stream's copies. Immutable once recorded.
class Event {
 public:
  virtual ~Event() = default;
  // True once the copies have landed. Never blocks; once true, stays true.
  virtual bool Query() const = 0;
  // Blocks until they have landed. kInternal if the device reported a
  // failure (the copies' destination bytes are then undefined).
  virtual Status Synchronize() const = 0;
};
using EventPtr = std::shared_ptr<const Event>;

class Device;

// A block of device or pinned host memory, returned to its Device on
// destruction. Move-only. REQUIRES: no copy in flight reads or writes it when
// it is destroyed (hand it to Device::ReleaseAfter instead).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept { Swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).Swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  // Device memory is not dereferenceable on the host; pinned memory is.
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  bool empty() const { return data_ == nullptr; }

 private:
  friend class Device;
  DeviceBuffer(Device* owner, std::byte* data, std::size_t size, MemoryKind kind)
      : owner_(owner), data_(data), size_(size), kind_(kind) {}
  void Swap(DeviceBuffer& o) noexcept {
    std::swap(owner_, o.owner_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(kind_, o.kind_);
  }

  Device* owner_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kDevice;
};

struct DeviceMemoryStats {
  std::size_t device_bytes_in_use = 0;    // requested bytes of live device buffers
  std::size_t device_capacity_bytes = 0;  // 0: bounded only by the card
  std::size_t pinned_bytes_in_use = 0;    // as the pool rounds them
  std::size_t pinned_capacity_bytes = 0;
  std::size_t pinned_largest_free_block = 0;
  std::uint64_t device_alloc_failures = 0;
  std::uint64_t pinned_alloc_failures = 0;
  std::size_t pending_releases = 0;  // holds waiting on an event
};

// Cross-process sharing of device rows (CUDA IPC; docs/SHM.md, "CUDA IPC").
// An IpcHandle is plain bytes a process sends to another process on the same
// node (e.g. in a reply); that process's Device::ImportIpc maps the rows.
// For CUDA, `memory` and `event` are cudaIpcMemHandle_t and
// cudaIpcEventHandle_t (64 bytes each, CUDA Runtime API, "Interprocess
// communication"); for FakeDevice they name a memfd (see src/testing/fake_device.h).
struct IpcHandle {
  static constexpr std::size_t kHandleBytes = 64;
  std::array<std::uint8_t, kHandleBytes> memory{};
  std::array<std::uint8_t, kHandleBytes> event{};  // all zero: ready at export, nothing to wait for
  std::uint64_t bytes = 0;                         // the shared rows' length

  // 2 * (64 + 64) + 16 lowercase hex digits (bytes as uint64 big-endian last).
  std::string Hex() const;
  // kInvalidArgument unless `hex` is exactly what Hex() writes.
  static StatusOr<IpcHandle> FromHex(std::string_view hex);
};

// The exporter's side: keeps the shared copy of the rows alive. Destroying it
// ends the sharing (an importer must be done with the rows by then: the
// lease rule). Thread-compatible.
class IpcExport {
 public:
  virtual ~IpcExport() = default;
  virtual const IpcHandle& handle() const = 0;
};

// The importer's side: the rows mapped into this process, as device memory of
// this process's Device (host-addressable for FakeDevice only). Destroying it
// unmaps them. Thread-compatible.
class IpcImport {
 public:
  virtual ~IpcImport() = default;
  virtual const std::byte* data() const = 0;
  virtual std::size_t size() const = 0;
  // Blocks until the exporter's copy into the shared rows has landed (the
  // handle's event). kInternal for a device failure.
  virtual Status WaitReady() const = 0;
};

class Device {
 public:
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // e.g. "cuda:0 (NVIDIA H200, pinned pool 1024 MiB)" or "fake (manual completion)".
  virtual std::string Describe() const = 0;

  // Device memory. An empty buffer for 0 bytes. kResourceExhausted when over
  // the device's capacity or the card's free memory.
  StatusOr<DeviceBuffer> Allocate(std::size_t bytes);
  // Pinned host memory from the pool. An empty buffer for 0 bytes.
  // kResourceExhausted when no free pool block fits (see host_memory_pool.h).
  StatusOr<DeviceBuffer> AllocatePinnedHost(std::size_t bytes);

  // Enqueues a copy of `bytes` from src to dst on `stream`; returns before it
  // lands. Host pointers may be pinned or pageable (pageable ones copy
  // synchronously on CUDA). REQUIRES both ranges stay allocated until an
  // event recorded after it completes. kInvalidArgument for null pointers
  // with bytes > 0; kInternal for a device failure.
  virtual Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) = 0;
  // An event that completes once everything enqueued on `stream` so far has.
  StatusOr<EventPtr> RecordEvent(Stream stream);
  // Work enqueued on `stream` later starts only after `event` completes. Does
  // not block the host. REQUIRES: event came from this device.
  virtual Status StreamWaitEvent(Stream stream, const Event& event) = 0;
  // Blocks until everything enqueued on `stream` has landed.
  virtual Status Synchronize(Stream stream) = 0;

  // Keeps `hold` alive until `event` completes (a null event: at once), so a
  // copy's buffers are freed only after the copy has landed. Never blocks.
  void ReleaseAfter(EventPtr event, std::shared_ptr<const void> hold);
  // Drops the holds whose events have completed; returns how many remain.
  std::size_t Poll();

  // Counters kept here plus the implementation's capacities and pool figures.
  DeviceMemoryStats memory_stats() const;

  // Copies `bytes` of this device's memory at `device_src` into a fresh
  // allocation another process on the node can import, and returns its
  // handle. The copy is enqueued on Stream::kOnboard after the work already
  // there; the handle's event completes when it has landed. Cost: one
  // device-to-device copy of `bytes` and one allocation, outside the
  // device's capacity accounting. kFailedPrecondition on a device that
  // cannot share memory (the default); kInvalidArgument for a null source
  // or 0 bytes; kInternal for a device failure.
  virtual StatusOr<std::unique_ptr<IpcExport>> ExportIpc(const void* device_src, std::size_t bytes);
  // Maps rows another process exported. kFailedPrecondition on a device that
  // cannot (the default) or for a handle of another kind of device;
  // kPermissionDenied when the kernel refuses (another user's FakeDevice);
  // kInternal for a device failure (e.g. a handle from another node).
  virtual StatusOr<std::unique_ptr<IpcImport>> ImportIpc(const IpcHandle& handle);

 protected:
  Device() = default;

  // Implementation hooks. DoAllocate returns nullptr when out of memory
  // (reported as kResourceExhausted) and a Status only for a device failure.
  // DoFree must not throw. Neither is called for 0 bytes.
  virtual StatusOr<std::byte*> DoAllocate(MemoryKind kind, std::size_t bytes) = 0;
  virtual void DoFree(MemoryKind kind, std::byte* p, std::size_t bytes) noexcept = 0;
  virtual StatusOr<EventPtr> DoRecordEvent(Stream stream) = 0;
  // Fills the capacity and pinned-pool fields of `stats`.
  virtual void AddMemoryStats(DeviceMemoryStats* stats) const = 0;

  // Waits for and drops every pending hold. Each implementation calls it
  // first thing in its destructor, while DoFree still works.
  void DrainReleases() noexcept;

 private:
  friend class DeviceBuffer;
  // Allocate and AllocatePinnedHost: one path for both kinds of memory.
  StatusOr<DeviceBuffer> AllocateKind(MemoryKind kind, std::size_t bytes);
  void Free(DeviceBuffer& buffer) noexcept;

  struct PendingRelease {
    EventPtr event;
    std::shared_ptr<const void> hold;
  };
  mutable Mutex release_mu_;
  std::deque<PendingRelease> pending_ EPD_GUARDED_BY(release_mu_);
  // Under release_mu_ too: cheap, and keeps the stats a consistent snapshot.
  std::size_t live_bytes_[2] EPD_GUARDED_BY(release_mu_) = {0, 0};  // by MemoryKind
  std::uint64_t alloc_failures_[2] EPD_GUARDED_BY(release_mu_) = {0, 0};
};

}  // namespace epd
