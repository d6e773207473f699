// FakeDevice: two FIFO "streams" of pending ops, landed by Advance() (the
// test), by CopyAsync itself (kImmediate) or by a background thread.
//
// Event model: each stream counts ops enqueued and ops retired; an event
// recorded on stream s when it had enqueued n ops is complete once s has
// retired n. A StreamWaitEvent is an op of its own that retires only when
// its event is complete, which is how CUDA orders one stream after another.
// Copies land front to back, possibly over several Advance calls, and the
// op retires (its events can complete) only when its last byte has landed.
#include "fake_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace epd {

class FakeDevice::FakeEvent final : public Event {
 public:
  FakeEvent(FakeDevice* dev, Stream stream, std::uint64_t target) : dev_(dev), stream_(stream), target_(target) {}

  bool Query() const override {
    std::lock_guard<std::mutex> lock(dev_->mu_);
    return dev_->DoneLocked(stream_, target_);
  }
  Status Synchronize() const override {
    std::unique_lock<std::mutex> lock(dev_->mu_);
    dev_->cv_.wait(lock, [&] { return dev_->DoneLocked(stream_, target_); });
    return Status::Ok();
  }

  FakeDevice* device() const { return dev_; }
  Stream stream() const { return stream_; }
  std::uint64_t target() const { return target_; }

 private:
  FakeDevice* const dev_;
  const Stream stream_;
  const std::uint64_t target_;
};

namespace {
constexpr int Index(Stream s) { return static_cast<int>(s); }
constexpr int Index(MemoryKind k) { return static_cast<int>(k); }
}  // namespace

namespace {
FakeDeviceOptions Checked(FakeDeviceOptions o) {
  if (o.background_chunk_bytes == 0) o.background_chunk_bytes = 1;  // 0 would never make progress
  return o;
}
}  // namespace

FakeDevice::FakeDevice(FakeDeviceOptions options) : options_(Checked(options)) {
  const std::size_t sizes[2] = {options_.device_capacity_bytes, options_.pinned_pool_bytes};
  for (int k = 0; k < 2; ++k) {
    const std::size_t a = HostMemoryPool::kAlignment;
    const std::size_t rounded = (sizes[k] + a - 1) / a * a;
    arenas_[k].base = rounded == 0 ? nullptr : static_cast<std::byte*>(std::aligned_alloc(a, rounded));
    if (rounded != 0 && arenas_[k].base == nullptr) throw std::bad_alloc();
    arenas_[k].pool = std::make_unique<HostMemoryPool>(arenas_[k].base, arenas_[k].base ? rounded : 0);
  }
  if (options_.completion == FakeCompletion::kBackground) engine_ = std::thread([this] { BackgroundLoop(); });
}

FakeDevice::~FakeDevice() {
  // A manual device's pending copies never land by themselves; land them so
  // the drain below cannot wait forever.
  if (options_.completion == FakeCompletion::kManual) CompleteAll();
  DrainReleases();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (engine_.joinable()) engine_.join();
  for (Arena& a : arenas_) std::free(a.base);
}

std::string FakeDevice::Describe() const {
  static constexpr const char* kModes[] = {"immediate", "manual", "background"};
  return std::string("fake (") + kModes[static_cast<int>(options_.completion)] + " completion, device " +
         std::to_string(options_.device_capacity_bytes >> 20) + " MiB, pinned pool " +
         std::to_string(options_.pinned_pool_bytes >> 20) + " MiB)";
}

StatusOr<std::byte*> FakeDevice::DoAllocate(MemoryKind kind, std::size_t bytes) {
  std::byte* p = arenas_[Index(kind)].pool->Allocate(bytes);
  if (p != nullptr) std::memset(p, static_cast<int>(kFreshPoison), bytes);
  return p;
}

void FakeDevice::DoFree(MemoryKind kind, std::byte* p, std::size_t bytes) noexcept {
  std::memset(p, static_cast<int>(kFreedPoison), bytes);
  arenas_[Index(kind)].pool->Free(p);
}

void FakeDevice::Enqueue(Stream stream, Op op) {
  StreamState& s = streams_[Index(stream)];
  s.ops.push_back(op);
  ++s.enqueued;
}

Status FakeDevice::CopyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind, Stream stream) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return InvalidArgument("CopyAsync: null " + std::string(dst == nullptr ? "dst" : "src") + " for " +
                           std::to_string(bytes) + " bytes");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    copies_.push_back(FakeCopyRecord{kind, stream, bytes});
    Op op;
    op.dst = static_cast<std::byte*>(dst);
    op.src = static_cast<const std::byte*>(src);
    op.bytes = bytes;
    Enqueue(stream, op);
    if (options_.completion == FakeCompletion::kImmediate)
      AdvanceLocked(stream, std::numeric_limits<std::size_t>::max());
  }
  cv_.notify_all();
  return Status::Ok();
}

StatusOr<EventPtr> FakeDevice::DoRecordEvent(Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return EventPtr(std::make_shared<FakeEvent>(this, stream, streams_[Index(stream)].enqueued));
}

Status FakeDevice::StreamWaitEvent(Stream stream, const Event& event) {
  const auto* fake = dynamic_cast<const FakeEvent*>(&event);
  if (fake == nullptr || fake->device() != this) {
    return InvalidArgument("StreamWaitEvent: the event was not recorded on this FakeDevice");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (DoneLocked(fake->stream(), fake->target())) return Status::Ok();  // nothing to wait for
    Op op;
    op.is_wait = true;
    op.wait_stream = fake->stream();
    op.wait_target = fake->target();
    Enqueue(stream, op);
  }
  cv_.notify_all();
  return Status::Ok();
}

Status FakeDevice::Synchronize(Stream stream) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = streams_[Index(stream)].enqueued;
  cv_.wait(lock, [&] { return DoneLocked(stream, target); });
  return Status::Ok();
}

bool FakeDevice::DoneLocked(Stream stream, std::uint64_t target) const {
  return streams_[Index(stream)].retired >= target;
}

std::size_t FakeDevice::AdvanceLocked(Stream stream, std::size_t max_bytes) {
  StreamState& s = streams_[Index(stream)];
  std::size_t landed = 0;
  while (!s.ops.empty()) {
    Op& op = s.ops.front();
    if (op.is_wait) {
      if (!DoneLocked(op.wait_stream, op.wait_target)) break;
    } else {
      const std::size_t n = std::min(op.bytes - op.landed, max_bytes - landed);
      // memmove: a test may copy a buffer onto itself; the real engines allow it too.
      if (n > 0) std::memmove(op.dst + op.landed, op.src + op.landed, n);
      op.landed += n;
      landed += n;
      if (op.landed < op.bytes) break;  // out of budget mid-copy: stays in flight
    }
    s.ops.pop_front();
    ++s.retired;
  }
  return landed;
}

std::size_t FakeDevice::Advance(Stream stream, std::size_t max_bytes) {
  std::size_t landed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    landed = AdvanceLocked(stream, max_bytes);
  }
  cv_.notify_all();
  return landed;
}

void FakeDevice::CompleteAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Each pass lands whatever is not blocked; a wait blocked on the other
    // stream unblocks once that stream has advanced. Waits only reference
    // already-enqueued work, so two passes per cross-wait suffice; loop
    // until no progress.
    for (;;) {
      const std::uint64_t before = streams_[0].retired + streams_[1].retired;
      AdvanceLocked(Stream::kOnboard, std::numeric_limits<std::size_t>::max());
      AdvanceLocked(Stream::kOffload, std::numeric_limits<std::size_t>::max());
      if (streams_[0].retired + streams_[1].retired == before) break;
    }
  }
  cv_.notify_all();
}

void FakeDevice::BackgroundLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  int next = 0;
  while (!stop_) {
    std::uint64_t progressed = 0;
    for (int i = 0; i < 2; ++i) {
      const Stream s = static_cast<Stream>((next + i) % 2);
      const std::uint64_t before = streams_[Index(s)].retired;
      progressed += AdvanceLocked(s, options_.background_chunk_bytes);
      progressed += streams_[Index(s)].retired - before;
    }
    next ^= 1;
    if (progressed > 0) {
      cv_.notify_all();
      // Let readers and the cache's thread run between chunks, so they meet
      // copies half landed.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      cv_.wait(lock, [&] {
        if (stop_) return true;
        for (const StreamState& s : streams_) {
          if (s.ops.empty()) continue;
          const Op& op = s.ops.front();
          if (!op.is_wait || DoneLocked(op.wait_stream, op.wait_target)) return true;
        }
        return false;
      });
    }
  }
}

std::size_t FakeDevice::queued(Stream stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_[Index(stream)].ops.size();
}

std::vector<FakeCopyRecord> FakeDevice::copies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copies_;
}

bool FakeDevice::IsLive(MemoryKind kind, const void* p) const {
  return arenas_[Index(kind)].pool->BlockSize(static_cast<const std::byte*>(p)) > 0;
}

void FakeDevice::AddMemoryStats(DeviceMemoryStats* stats) const {
  const HostMemoryPoolStats dev = arenas_[0].pool->stats();
  const HostMemoryPoolStats pin = arenas_[1].pool->stats();
  stats->device_capacity_bytes = dev.capacity_bytes;
  stats->pinned_capacity_bytes = pin.capacity_bytes;
  stats->pinned_bytes_in_use = pin.bytes_in_use;
  stats->pinned_largest_free_block = pin.largest_free_block;
}

}  // namespace epd
