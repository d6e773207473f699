// Device: the parts every implementation shares: buffer bookkeeping and the
// deferred-release list.
//
// The release list holds (event, hold) pairs. Poll() moves the pairs whose
// event has completed out under the lock and drops them after unlocking:
// dropping a hold can free buffers (Device::Free takes the same lock) or
// destroy a TierEmbedding that itself calls ReleaseAfter, so nothing is
// destroyed while the lock is held.
#include "epd/gpu/device.h"

#include <algorithm>
#include <string>
#include <vector>

namespace epd {

std::string_view MemoryKindName(MemoryKind kind) { return kind == MemoryKind::kDevice ? "device" : "pinned_host"; }
std::string_view CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "h2d";
    case CopyKind::kDeviceToHost:
      return "d2h";
    case CopyKind::kDeviceToDevice:
      return "d2d";
  }
  return "unknown";
}
std::string_view StreamName(Stream stream) { return stream == Stream::kOnboard ? "onboard" : "offload"; }

DeviceBuffer::~DeviceBuffer() {
  if (owner_ != nullptr) owner_->Free(*this);
}

Device::~Device() = default;

StatusOr<DeviceBuffer> Device::Allocate(std::size_t bytes) { return AllocateKind(MemoryKind::kDevice, bytes); }

StatusOr<DeviceBuffer> Device::AllocatePinnedHost(std::size_t bytes) {
  return AllocateKind(MemoryKind::kPinnedHost, bytes);
}

StatusOr<DeviceBuffer> Device::AllocateKind(MemoryKind kind, std::size_t bytes) {
  Poll();  // frees whatever has landed first, so it can be reused now
  if (bytes == 0) return DeviceBuffer(nullptr, nullptr, 0, kind);
  StatusOr<std::byte*> p = DoAllocate(kind, bytes);
  if (!p.ok()) return p.status();
  const int k = static_cast<int>(kind);
  MutexLock lock(release_mu_);
  if (*p == nullptr) {
    ++alloc_failures_[k];
    const std::string what =
        kind == MemoryKind::kDevice ? "device memory exhausted allocating " : "pinned host pool has no free block of ";
    return ResourceExhausted(what + std::to_string(bytes) + " bytes (" + std::to_string(live_bytes_[k]) +
                             " bytes in use)");
  }
  live_bytes_[k] += bytes;
  return DeviceBuffer(this, *p, bytes, kind);
}

void Device::Free(DeviceBuffer& buffer) noexcept {
  if (buffer.data_ == nullptr) return;
  const int k = static_cast<int>(buffer.kind_);
  DoFree(buffer.kind_, buffer.data_, buffer.size_);
  MutexLock lock(release_mu_);
  live_bytes_[k] -= buffer.size_;
}

StatusOr<EventPtr> Device::RecordEvent(Stream stream) {
  Poll();
  return DoRecordEvent(stream);
}

void Device::ReleaseAfter(EventPtr event, std::shared_ptr<const void> hold) {
  if (event == nullptr || event->Query()) return;  // `hold` drops here, outside any lock
  MutexLock lock(release_mu_);
  pending_.push_back(PendingRelease{std::move(event), std::move(hold)});
}

std::size_t Device::Poll() {
  std::vector<PendingRelease> done;
  std::size_t remaining;
  {
    MutexLock lock(release_mu_);
    // Events of one stream complete in order, but the list mixes two streams,
    // so every entry is checked; the list holds only copies in flight.
    std::deque<PendingRelease> keep;
    for (PendingRelease& p : pending_) {
      if (p.event->Query()) {
        done.push_back(std::move(p));
      } else {
        keep.push_back(std::move(p));
      }
    }
    pending_.swap(keep);
    remaining = pending_.size();
  }
  return remaining;  // `done` drops here, after unlocking
}

void Device::DrainReleases() noexcept {
  // Dropping a hold may enqueue another (an entry released before its own
  // copy landed), so loop until the list stays empty.
  for (;;) {
    std::deque<PendingRelease> batch;
    {
      MutexLock lock(release_mu_);
      if (pending_.empty()) return;
      batch.swap(pending_);
    }
    for (PendingRelease& p : batch) {
      // A failed copy is over too; its bytes are moot at shutdown.
      (void)p.event->Synchronize();
    }
  }
}

DeviceMemoryStats Device::memory_stats() const {
  DeviceMemoryStats s;
  {
    MutexLock lock(release_mu_);
    s.device_bytes_in_use = live_bytes_[0];
    s.device_alloc_failures = alloc_failures_[0];
    s.pinned_alloc_failures = alloc_failures_[1];
    s.pending_releases = pending_.size();
  }
  AddMemoryStats(&s);
  return s;
}

StatusOr<std::unique_ptr<IpcExport>> Device::ExportIpc(const void*, std::size_t) {
  return FailedPrecondition(Describe() + " cannot share memory with other processes");
}

StatusOr<std::unique_ptr<IpcImport>> Device::ImportIpc(const IpcHandle&) {
  return FailedPrecondition(Describe() + " cannot map memory of other processes");
}

std::string IpcHandle::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * (2 * kHandleBytes + 8));
  auto put = [&](std::uint8_t b) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  };
  for (std::uint8_t b : memory) put(b);
  for (std::uint8_t b : event) put(b);
  for (int i = 7; i >= 0; --i) put(static_cast<std::uint8_t>(bytes >> (8 * i)));
  return out;
}

StatusOr<IpcHandle> IpcHandle::FromHex(std::string_view hex) {
  constexpr std::size_t kDigitsWanted = 2 * (2 * kHandleBytes + 8);
  if (hex.size() != kDigitsWanted) {
    return InvalidArgument("an IPC handle is " + std::to_string(kDigitsWanted) + " hex digits, got " +
                           std::to_string(hex.size()));
  }
  std::vector<std::uint8_t> raw(hex.size() / 2);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    int v = 0;
    for (char c : hex.substr(2 * i, 2)) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return InvalidArgument("an IPC handle has a character that is not a lowercase hex digit");
      v = v * 16 + d;
    }
    raw[i] = static_cast<std::uint8_t>(v);
  }
  IpcHandle h;
  std::copy(raw.begin(), raw.begin() + kHandleBytes, h.memory.begin());
  std::copy(raw.begin() + kHandleBytes, raw.begin() + 2 * kHandleBytes, h.event.begin());
  for (std::size_t i = 2 * kHandleBytes; i < raw.size(); ++i) h.bytes = (h.bytes << 8) | raw[i];
  return h;
}

}  // namespace epd
