// TierEmbedding and the tier copies.
//
// Every copy follows one pattern: allocate the destination, order the copy
// after the source's own fill (StreamWaitEvent, on the device, when the
// source is not ready yet), enqueue, record the event, hand the SOURCE to
// Device::ReleaseAfter(event) and return the destination with that event as
// its fill event. Nothing on this path blocks the host.
//
// Failure after a copy was enqueued (a later CopyAsync or RecordEvent
// fails): the destination may still be written by the enqueued part, so it
// is not freed at once; it goes to ReleaseAfter behind a fresh event, or,
// if no event can be recorded, after synchronising the stream.
#include "epd/gpu/device_tier.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <utility>

namespace epd {

namespace {

// Copies main_src and deepstack_src (device memory) into the two host ranges
// on Stream::kOffload and waits for them: the ranges may die once this
// returns. Even after a failed enqueue it waits for what was enqueued.
Status DeviceToHostAndWait(Device& device, const std::byte* main_src, std::span<std::byte> main,
                           const std::byte* deepstack_src, std::span<std::byte> deepstack) {
  Status st;
  if (!main.empty())
    st = device.CopyAsync(main.data(), main_src, main.size(), CopyKind::kDeviceToHost, Stream::kOffload);
  if (st.ok() && !deepstack.empty()) {
    st = device.CopyAsync(deepstack.data(), deepstack_src, deepstack.size(), CopyKind::kDeviceToHost, Stream::kOffload);
  }
  StatusOr<EventPtr> ev = device.RecordEvent(Stream::kOffload);
  Status done = ev.ok() ? (*ev)->Synchronize() : device.Synchronize(Stream::kOffload);
  if (!st.ok()) return st;
  if (!ev.ok()) return ev.status();
  return done;
}

}  // namespace

TierEmbedding::TierEmbedding(Private, Device* device, EmbeddingShape shape, DeviceBuffer buffer, EventPtr filled)
    : device_(device), shape_(shape), buffer_(std::move(buffer)), filled_(std::move(filled)) {
  if (filled_ == nullptr) ready_cache_.store(true, std::memory_order_release);
}

TierEmbedding::~TierEmbedding() {
  // Never free a buffer a copy may still write; the device frees it once the
  // fill event completes.
  if (!buffer_.empty() && !ready()) {
    device_->ReleaseAfter(filled_, std::make_shared<DeviceBuffer>(std::move(buffer_)));
  }
}

MemoryKind TierEmbedding::where() const { return buffer_.kind(); }

bool TierEmbedding::ready() const {
  if (ready_cache_.load(std::memory_order_acquire)) return true;
  if (!filled_->Query()) return false;
  ready_cache_.store(true, std::memory_order_release);
  return true;
}

Status TierEmbedding::Wait() const {
  if (ready()) return Status::Ok();
  Status st = filled_->Synchronize();
  if (st.ok()) ready_cache_.store(true, std::memory_order_release);
  return st;
}

std::string_view TierEmbedding::location() const { return MemoryKindName(where()); }

Status TierEmbedding::CopyToHost(std::span<std::byte> main, std::span<std::byte> deepstack) const {
  if (main.size() != shape_.main_bytes() || deepstack.size() != shape_.deepstack_bytes()) {
    return InvalidArgument("TierEmbedding::CopyToHost: ranges of " + std::to_string(main.size()) + "+" +
                           std::to_string(deepstack.size()) + " bytes for an entry of " +
                           std::to_string(shape_.main_bytes()) + "+" + std::to_string(shape_.deepstack_bytes()));
  }
  if (Status st = Wait(); !st.ok()) return st;
  if (nbytes() == 0) return Status::Ok();
  const std::byte* src = buffer_.data();
  if (where() == MemoryKind::kPinnedHost) {
    if (!main.empty()) std::memcpy(main.data(), src, main.size());
    if (!deepstack.empty()) std::memcpy(deepstack.data(), src + main.size(), deepstack.size());
    return Status::Ok();
  }
  // Device bytes: this entry (held by the caller) keeps the source alive.
  return DeviceToHostAndWait(*device_, src, main, src + main.size(), deepstack);
}

StatusOr<Embedding> TierEmbedding::ToHostEmbedding() const {
  Embedding out;
  out.tokens = shape_.tokens;
  out.hidden = shape_.hidden;
  out.deepstack_layers = shape_.deepstack_layers;
  out.dtype = shape_.dtype;
  out.main.resize(shape_.main_bytes());
  out.deepstack.resize(shape_.deepstack_bytes());
  if (Status st = CopyToHost(out.main, out.deepstack); !st.ok()) return st;
  return out;
}

namespace {

// Disposes of `dst` after a failure that may have left part of a copy into
// it enqueued on `stream` (see the file comment). Returns `why`.
Status FailAfterEnqueue(Device& device, Stream stream, DeviceBuffer dst, std::shared_ptr<const void> src_hold,
                        Status why) {
  StatusOr<EventPtr> ev = device.RecordEvent(stream);
  if (ev.ok()) {
    device.ReleaseAfter(*ev, std::make_shared<DeviceBuffer>(std::move(dst)));
    device.ReleaseAfter(*ev, std::move(src_hold));
  } else {
    (void)device.Synchronize(stream);  // best effort: the device is already failing
  }
  return why;
}

Status CheckSource(const Device& device, const TierEmbeddingPtr& src, const char* what, const Device* src_device) {
  if (src == nullptr) return InvalidArgument(std::string(what) + ": null source entry");
  if (src_device != &device) {
    return InvalidArgument(std::string(what) + ": the source entry belongs to another device");
  }
  return Status::Ok();
}

// A new device buffer filled on Stream::kOnboard from two sources, main
// bytes then deepstack bytes (host memory for kHostToDevice, device memory
// for kDeviceToDevice). `hold` (what keeps the sources alive) is released
// once the copy has landed; `event` is null when there was nothing to copy.
struct Filled {
  DeviceBuffer buffer;
  EventPtr event;
};
StatusOr<Filled> FillOnDevice(Device& device, const std::byte* main, std::size_t main_bytes, const std::byte* deepstack,
                              std::size_t deep_bytes, CopyKind kind, std::shared_ptr<const void> hold) {
  StatusOr<DeviceBuffer> buf = device.Allocate(main_bytes + deep_bytes);
  if (!buf.ok()) return buf.status();
  if (main_bytes + deep_bytes == 0) return Filled{std::move(*buf), nullptr};
  Status st;
  if (main_bytes > 0) {
    st = device.CopyAsync(buf->data(), main, main_bytes, kind, Stream::kOnboard);
    if (!st.ok()) return st;  // nothing enqueued: the buffer can go now
  }
  if (deep_bytes > 0) {
    st = device.CopyAsync(buf->data() + main_bytes, deepstack, deep_bytes, kind, Stream::kOnboard);
    if (!st.ok()) return FailAfterEnqueue(device, Stream::kOnboard, std::move(*buf), hold, st);
  }
  StatusOr<EventPtr> ev = device.RecordEvent(Stream::kOnboard);
  if (!ev.ok()) return FailAfterEnqueue(device, Stream::kOnboard, std::move(*buf), hold, ev.status());
  device.ReleaseAfter(*ev, std::move(hold));
  return Filled{std::move(*buf), *ev};
}

}  // namespace

StatusOr<TierEmbeddingPtr> UploadEmbedding(Device& device, EmbeddingPtr emb, MemoryKind where) {
  if (emb == nullptr) return InvalidArgument("UploadEmbedding: null embedding");
  if (emb->tokens < 0 || emb->hidden < 0 || emb->deepstack_layers < 0) {
    return InvalidArgument("UploadEmbedding: negative shape (tokens " + std::to_string(emb->tokens) + ", hidden " +
                           std::to_string(emb->hidden) + ", deepstack_layers " + std::to_string(emb->deepstack_layers) +
                           ")");
  }
  const EmbeddingShape shape{emb->tokens, emb->hidden, emb->deepstack_layers, emb->dtype};
  if (emb->main.size() != shape.main_bytes() || emb->deepstack.size() != shape.deepstack_bytes()) {
    return InvalidArgument("UploadEmbedding: byte sizes do not match the shape: main " +
                           std::to_string(emb->main.size()) + " (expected " + std::to_string(shape.main_bytes()) +
                           "), deepstack " + std::to_string(emb->deepstack.size()) + " (expected " +
                           std::to_string(shape.deepstack_bytes()) + ")");
  }
  const std::size_t main_bytes = shape.main_bytes();
  if (where == MemoryKind::kPinnedHost) {
    StatusOr<DeviceBuffer> buf = device.AllocatePinnedHost(shape.nbytes());
    if (!buf.ok()) return buf.status();
    if (main_bytes > 0) std::memcpy(buf->data(), emb->main.data(), main_bytes);
    if (!emb->deepstack.empty()) std::memcpy(buf->data() + main_bytes, emb->deepstack.data(), emb->deepstack.size());
    return std::make_shared<const TierEmbedding>(TierEmbedding::Private{}, &device, shape, std::move(*buf), nullptr);
  }
  const std::byte* main = emb->main.data();
  const std::byte* deepstack = emb->deepstack.data();
  const std::size_t deep_bytes = emb->deepstack.size();
  StatusOr<Filled> f =
      FillOnDevice(device, main, main_bytes, deepstack, deep_bytes, CopyKind::kHostToDevice, std::move(emb));
  if (!f.ok()) return f.status();
  return std::make_shared<const TierEmbedding>(TierEmbedding::Private{}, &device, shape, std::move(f->buffer),
                                               f->event);
}

// The one copy between tiers: `src` into a new entry in `to` (kPinnedHost:
// an offload, device -> host on Stream::kOffload; kDevice: an onboard, host
// -> device on Stream::kOnboard). An entry already in `to` is returned as
// is. A source still being filled (a victim whose own upload or onboard, or
// an L2 entry whose offload, is in flight) is ordered after that copy on the
// device rather than waited for here; the source itself is handed to
// ReleaseAfter, so its buffer goes once this copy has landed.
StatusOr<TierEmbeddingPtr> TierEmbedding::CopyBetweenTiers(Device& device, const TierEmbeddingPtr& src, MemoryKind to,
                                                           const char* what) {
  if (Status st = CheckSource(device, src, what, src ? src->device_ : nullptr); !st.ok()) return st;
  if (src->where() == to) return src;
  const bool offload = to == MemoryKind::kPinnedHost;
  const Stream stream = offload ? Stream::kOffload : Stream::kOnboard;
  StatusOr<DeviceBuffer> buf = offload ? device.AllocatePinnedHost(src->nbytes()) : device.Allocate(src->nbytes());
  if (!buf.ok()) return buf.status();
  if (src->nbytes() == 0) {
    return std::make_shared<const TierEmbedding>(TierEmbedding::Private{}, &device, src->shape_, std::move(*buf),
                                                 nullptr);
  }
  if (!src->ready()) {
    if (Status st = device.StreamWaitEvent(stream, *src->filled_); !st.ok()) return st;
  }
  Status st = device.CopyAsync(buf->data(), src->buffer_.data(), src->nbytes(),
                               offload ? CopyKind::kDeviceToHost : CopyKind::kHostToDevice, stream);
  if (!st.ok()) return st;
  StatusOr<EventPtr> ev = device.RecordEvent(stream);
  if (!ev.ok()) return FailAfterEnqueue(device, stream, std::move(*buf), src, ev.status());
  device.ReleaseAfter(*ev, src);
  return std::make_shared<const TierEmbedding>(TierEmbedding::Private{}, &device, src->shape_, std::move(*buf), *ev);
}

StatusOr<TierEmbeddingPtr> OffloadEmbedding(Device& device, const TierEmbeddingPtr& src) {
  return TierEmbedding::CopyBetweenTiers(device, src, MemoryKind::kPinnedHost, "OffloadEmbedding");
}

StatusOr<TierEmbeddingPtr> OnboardEmbedding(Device& device, const TierEmbeddingPtr& src) {
  return TierEmbedding::CopyBetweenTiers(device, src, MemoryKind::kDevice, "OnboardEmbedding");
}

namespace {

// One tier move for both directions: an embedding already in `to` passes
// through; a copy that lands is counted in `moves` / `bytes`; a full target
// (kResourceExhausted) is counted in `full` and answered by `when_full`
// (nullptr: the victim is dropped; the source: it is served from where it
// is); any other failure throws, for the worker's fence.
using Counter = std::uint64_t DeviceTierStats::*;
using CopyFn = StatusOr<TierEmbeddingPtr> (*)(Device&, const TierEmbeddingPtr&);
TierCopyFn MakeTierMoveFn(Device& device, DeviceTierStats* stats, MemoryKind to, CopyFn copy, Counter moves,
                          Counter bytes, Counter full, bool keep_source_when_full) {
  return [&device, stats, to, copy, moves, bytes, full,
          keep_source_when_full](const TierEmbeddingPtr& v) -> TierEmbeddingPtr {
    if (v == nullptr || v->where() == to) return v;
    StatusOr<TierEmbeddingPtr> out = copy(device, v);
    if (out.ok()) {
      if (stats != nullptr) {
        ++(stats->*moves);
        stats->*bytes += v->nbytes();
      }
      return std::move(out).value();
    }
    if (out.status().code() == StatusCode::kResourceExhausted) {
      if (stats != nullptr) ++(stats->*full);
      return keep_source_when_full ? v : nullptr;
    }
    throw Error(out.status());
  };
}

}  // namespace

// An L2 too small for a victim: the tiered cache drops a null demotion.
TierCopyFn MakeOffloadFn(Device& device, DeviceTierStats* stats) {
  return MakeTierMoveFn(device, stats, MemoryKind::kPinnedHost, &OffloadEmbedding, &DeviceTierStats::offloads,
                        &DeviceTierStats::offload_bytes, &DeviceTierStats::offload_dropped,
                        /*keep_source_when_full=*/false);
}

// No VRAM for a promoted entry: serve it from pinned memory rather than lose it.
TierCopyFn MakeOnboardFn(Device& device, DeviceTierStats* stats) {
  return MakeTierMoveFn(device, stats, MemoryKind::kDevice, &OnboardEmbedding, &DeviceTierStats::onboards,
                        &DeviceTierStats::onboard_bytes, &DeviceTierStats::onboard_fallbacks,
                        /*keep_source_when_full=*/true);
}

StatusOr<TierEmbeddingPtr> AdoptDeviceRows(Device& device, const DeviceRows& rows) {
  if (rows.tokens < 0 || rows.hidden < 0 || rows.deepstack_layers < 0) {
    return InvalidArgument("AdoptDeviceRows: negative shape (tokens " + std::to_string(rows.tokens) + ", hidden " +
                           std::to_string(rows.hidden) + ", deepstack_layers " + std::to_string(rows.deepstack_layers) +
                           ")");
  }
  const EmbeddingShape shape{rows.tokens, rows.hidden, rows.deepstack_layers, rows.dtype};
  const std::size_t main_bytes = shape.main_bytes();
  const std::size_t deep_bytes = shape.deepstack_bytes();
  if ((main_bytes > 0 && rows.main == nullptr) || (deep_bytes > 0 && rows.deepstack == nullptr)) {
    return InvalidArgument("AdoptDeviceRows: null " + std::string(rows.main == nullptr ? "main" : "deepstack") +
                           " rows for " + std::to_string(rows.main == nullptr ? main_bytes : deep_bytes) + " bytes");
  }
  StatusOr<Filled> f =
      FillOnDevice(device, rows.main, main_bytes, rows.deepstack, deep_bytes, CopyKind::kDeviceToDevice, rows.owner);
  if (!f.ok()) return f.status();
  // The tower's output (rows.owner) lives until the copy has landed.
  return std::make_shared<const TierEmbedding>(TierEmbedding::Private{}, &device, shape, std::move(f->buffer),
                                               f->event);
}

namespace {

// The TierEmbedding behind an Embedding, or null for a host Embedding (or
// one resident through another ResidentBytes).
TierEmbeddingPtr TierOf(const EmbeddingPtr& e) {
  return e == nullptr ? nullptr : std::dynamic_pointer_cast<const TierEmbedding>(e->resident);
}

// `grid` is the item's, carried along from the Embedding or DeviceRows the
// entry came from (a TierEmbedding holds only bytes and their shape).
EmbeddingPtr Wrap(TierEmbeddingPtr t, const GridTHW& grid) {
  auto e = std::make_shared<Embedding>();
  const EmbeddingShape& s = t->shape();
  e->tokens = s.tokens;
  e->hidden = s.hidden;
  e->deepstack_layers = s.deepstack_layers;
  e->dtype = s.dtype;
  e->grid = grid;
  e->resident = std::move(t);
  return e;
}

// The rows copied device -> host into a host Embedding (VRAM full), waiting
// for the copy on the offload stream.
StatusOr<EmbeddingPtr> RowsToHost(Device& device, const DeviceRows& rows) {
  auto e = std::make_shared<Embedding>();
  e->tokens = rows.tokens;
  e->hidden = rows.hidden;
  e->deepstack_layers = rows.deepstack_layers;
  e->dtype = rows.dtype;
  e->grid = rows.grid;
  const EmbeddingShape shape{rows.tokens, rows.hidden, rows.deepstack_layers, rows.dtype};
  e->main.resize(shape.main_bytes());
  e->deepstack.resize(shape.deepstack_bytes());
  if (Status st = DeviceToHostAndWait(device, rows.main, e->main, rows.deepstack, e->deepstack); !st.ok()) return st;
  return EmbeddingPtr(std::move(e));
}

}  // namespace

GpuTierSizing SizeGpuTier(std::size_t l1_bytes, std::size_t l2_bytes) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  GpuTierSizing s;
  s.pinned_pool_bytes = l2_bytes + std::max(l2_bytes / 16, 64 * kMiB);
  s.device_bytes_limit = l1_bytes + std::max(l1_bytes / 4, 256 * kMiB);
  return s;
}

EmbeddingTierHooks MakeEmbeddingTierHooks(Device& device, DeviceTierStats* stats) {
  EmbeddingTierHooks hooks;
  hooks.to_host = [offload = MakeOffloadFn(device, stats)](const EmbeddingPtr& e) -> EmbeddingPtr {
    TierEmbeddingPtr t = TierOf(e);
    if (t == nullptr || t->where() == MemoryKind::kPinnedHost) return e;
    TierEmbeddingPtr moved = offload(t);
    return moved == nullptr ? nullptr : Wrap(std::move(moved), e->grid);
  };
  hooks.to_device = [onboard = MakeOnboardFn(device, stats)](const EmbeddingPtr& e) -> EmbeddingPtr {
    TierEmbeddingPtr t = TierOf(e);
    if (t == nullptr || t->where() == MemoryKind::kDevice) return e;
    TierEmbeddingPtr moved = onboard(t);
    return moved == t ? e : Wrap(std::move(moved), e->grid);
  };
  hooks.adopt_device_rows = [&device, stats](const DeviceRows& rows) -> StatusOr<EmbeddingPtr> {
    StatusOr<TierEmbeddingPtr> t = AdoptDeviceRows(device, rows);
    if (t.ok()) {
      if (stats != nullptr) {
        ++stats->adopts;
        stats->adopt_bytes += (*t)->nbytes();
      }
      return Wrap(std::move(t).value(), rows.grid);
    }
    if (t.status().code() != StatusCode::kResourceExhausted) return t.status();
    if (stats != nullptr) ++stats->adopt_fallbacks;
    return RowsToHost(device, rows);
  };
  return hooks;
}

}  // namespace epd
