// fake_device.h: a Device made of CPU memory, for testing the tiers
// without an accelerator.
//
// "VRAM" and "pinned host memory" are two ordinary heap arenas, each carved
// by the same HostMemoryPool the CUDA device uses for its pinned pool, so
// capacity and fragmentation behave as on the real device. Every copy is
// recorded (kind, stream, bytes) in enqueue order.
//
// Completion modes (FakeDeviceOptions::completion):
//   kImmediate   a copy lands inside CopyAsync; every event is complete.
//   kManual      copies wait in per-stream FIFO queues until the test calls
//                Advance()/CompleteAll(), so a test sees copies in flight and
//                can land half of one. Event::Synchronize and
//                Device::Synchronize block until another thread advances;
//                never call them (or ToHostEmbedding) from the only thread.
//   kBackground  a background thread (the "copy engine") lands queued copies
//                in chunks of background_chunk_bytes, alternating streams, so
//                a concurrent reader can meet a half-landed copy.
// A copy reads its source when it lands, as DMA does, not when it is
// enqueued: a source freed too early is caught.
//
// Poison: fresh buffers are filled with kFreshPoison and freed ones with
// kFreedPoison, so bytes read before a copy lands, or after a buffer was
// released early, differ from any payload a test writes.
//
// IPC (ExportIpc/ImportIpc, epd/gpu/device.h) works across processes on CPU:
// ExportIpc copies the source bytes, as they are at the call (REQUIRES the
// copies into them have landed), into a fresh memfd of mode 0600, and the
// handle names it by (pid, fd, random id); ImportIpc maps it read-only
// through /proc/<pid>/fd/<fd> (the exporter's user only, as for the shared-
// memory arena, docs/SHM.md). The handle has no event: the rows are ready at
// export.
//
// Thread safety: thread-safe, like every Device.
//
// Example:
//   epd::FakeDevice dev({.completion = epd::FakeCompletion::kManual});
//   auto l1 = epd::UploadEmbedding(dev, emb);        // H2D queued on kOnboard
//   dev.CompleteAll();                               // lands it
//   EXPECT_EQ(dev.copies().size(), 1u);
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epd/gpu/device.h"
#include "epd/gpu/host_memory_pool.h"

namespace epd {

enum class FakeCompletion : std::uint8_t { kImmediate = 0, kManual = 1, kBackground = 2 };

struct FakeDeviceOptions {
  // Size of the "VRAM" arena. Default 64 MiB.
  std::size_t device_capacity_bytes = std::size_t{64} << 20;
  // Size of the pinned-pool arena. Default 64 MiB.
  std::size_t pinned_pool_bytes = std::size_t{64} << 20;
  FakeCompletion completion = FakeCompletion::kImmediate;
  // kBackground: bytes landed per step of the copy engine. Default 4 KiB.
  std::size_t background_chunk_bytes = 4096;
};

// One CopyAsync as enqueued.
struct FakeCopyRecord {
  CopyKind kind;
  Stream stream;
  std::size_t bytes;
};

class FakeDevice final : public Device {
 public:
  static constexpr std::byte kFreshPoison{0xA5};
  static constexpr std::byte kFreedPoison{0xDD};

  explicit FakeDevice(FakeDeviceOptions options = {});
  ~FakeDevice() override;

  std::string Describe() const override;
  StatusOr<std::unique_ptr<IpcExport>> ExportIpc(const void* device_src, std::size_t bytes) override;
  StatusOr<std::unique_ptr<IpcImport>> ImportIpc(const IpcHandle& handle) override;
  Status CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) override;
  // kInvalidArgument for an event of another device type.
  Status StreamWaitEvent(Stream stream, const Event& event) override;
  Status Synchronize(Stream stream) override;

  // kManual: lands up to `max_bytes` of `stream`'s queued work in FIFO order
  // (a wait on an incomplete event stops it). Returns bytes landed.
  std::size_t Advance(Stream stream, std::size_t max_bytes = std::numeric_limits<std::size_t>::max());
  // kManual: lands everything queued on both streams.
  void CompleteAll();
  // Copies and waits queued on `stream` and not yet landed.
  std::size_t queued(Stream stream) const;
  // Every copy enqueued so far, in order.
  std::vector<FakeCopyRecord> copies() const;
  // Whether a live buffer of `kind` starts at p (false once freed).
  bool IsLive(MemoryKind kind, const void* p) const;

 protected:
  StatusOr<std::byte*> DoAllocate(MemoryKind kind, std::size_t bytes) override;
  void DoFree(MemoryKind kind, std::byte* p, std::size_t bytes) noexcept override;
  StatusOr<EventPtr> DoRecordEvent(Stream stream) override;
  void AddMemoryStats(DeviceMemoryStats* stats) const override;

 private:
  class FakeEvent;
  struct Op {
    std::byte* dst = nullptr;  // copy: destination
    const std::byte* src = nullptr;
    std::size_t bytes = 0;
    std::size_t landed = 0;
    bool is_wait = false;  // wait: until wait_stream retires wait_target ops
    Stream wait_stream = Stream::kOnboard;
    std::uint64_t wait_target = 0;
  };
  struct StreamState {
    std::deque<Op> ops;
    std::uint64_t enqueued = 0;  // ops ever enqueued
    std::uint64_t retired = 0;   // ops ever landed
  };
  struct Arena {
    std::byte* base = nullptr;
    std::unique_ptr<HostMemoryPool> pool;
  };

  std::size_t AdvanceLocked(Stream stream, std::size_t max_bytes);
  bool DoneLocked(Stream stream, std::uint64_t target) const;
  void Enqueue(Stream stream, Op op);  // REQUIRES mu_ held
  void BackgroundLoop();

  const FakeDeviceOptions options_;
  Arena arenas_[2];  // by MemoryKind
  mutable std::mutex mu_;
  std::condition_variable cv_;  // any retirement, any enqueue, stop
  StreamState streams_[2];      // by Stream
  std::vector<FakeCopyRecord> copies_;
  bool stop_ = false;
  std::thread engine_;
};

}  // namespace epd
