// epd/gpu/device_tier.h: embeddings whose bytes live in device memory (L1) or
// pinned host memory (L2), and the async copies that move them between tiers.
//
// TierEmbedding is the value type of the GPU-tiered cache,
//   TieredEmbeddingCache<ContentKey, TierEmbeddingPtr, ContentKeyHash>
//       cache(l1_bytes, l2_bytes, MakeOffloadFn(dev), MakeOnboardFn(dev));
// Where EmbeddingPtr holds host vectors, a TierEmbedding holds one Device
// buffer (main rows, then deepstack rows, contiguous; layout as
// epd/core/embedding.h) and the event of the copy that filled it.
//
// Readiness: a TierEmbedding is handed out as soon as its copy is enqueued.
// Its bytes are defined only once ready() (the copy's event completed); no
// API exposes them before: Wait() blocks until then, ToHostEmbedding() waits
// and then copies, so no reader can see a half-copied entry.
//
// Ownership (the TensorRT-LLM rule: a copy's source lives until its event):
//   - Offload/Onboard hand the SOURCE entry to Device::ReleaseAfter(copy
//     event): the device drops it, and with it (if no one else holds it) its
//     buffer, only after the copy has landed. So an L1 victim's VRAM is freed
//     after its offload lands, and an L2 entry's pinned block after its
//     onboard lands, without blocking the cache's thread.
//   - A TierEmbedding destroyed before its own copy landed hands its buffer
//     to ReleaseAfter too, so an in-flight copy never writes freed memory.
//   - A copy whose source is not ready yet is ordered after it on the device
//     (StreamWaitEvent), never by blocking the host.
// Device::Poll() (also run by every allocation) performs the deferred frees.
//
// Copy functions for TieredEmbeddingCache (TierCopyFn, V -> V):
//   MakeOffloadFn   device -> pinned host on Stream::kOffload. When the pinned
//                   pool has no block for it, returns nullptr: the tiered
//                   cache then drops the victim exactly as if L2 were too
//                   small (counted in offload_dropped). An entry already in
//                   host memory is returned as is.
//   MakeOnboardFn   pinned host -> device on Stream::kOnboard. When device
//                   memory is exhausted, returns the source itself: the entry
//                   is served from pinned memory and sits in L1 (counted in
//                   onboard_fallbacks); nothing is lost. An entry already on
//                   the device is returned as is.
//   Both throw epd::Error(kInternal) on a device failure (a CUDA error); the
//   tiered cache propagates it (epd/core/tiered_cache.h says what is then lost).
//
// Complexity: one pool allocation (O(log blocks)) and one async copy per call;
// no host-side wait. ToHostEmbedding is one device->host copy (or memcpy from
// pinned memory) of nbytes().
// Thread safety: a TierEmbedding is immutable once built; any thread may
// call ready/Wait/ToHostEmbedding or drop it. The copy functions may run on
// any thread (the Device is thread-safe); a DeviceTierStats must not be
// shared by functions that run on different threads (plain counters).
//
// The encode worker's hooks (MakeEmbeddingTierHooks): the worker caches
// EmbeddingPtr values; with these hooks its L1 entries are Embeddings whose
// `resident` is a TierEmbedding in VRAM, and its L2 entries one in pinned
// memory. adopt_device_rows copies each item's rows of a device-resident
// tower output device -> device into a fresh L1 entry, so a miss never
// round-trips through host memory.
//
// Example:
//   epd::FakeDevice dev;   // or *epd::OpenCudaDevice(opts)
//   auto l1 = epd::UploadEmbedding(dev, emb);      // StatusOr<TierEmbeddingPtr>
//   cache.Put(key, *l1, (*l1)->nbytes());
//   if (auto hit = cache.Get(key)) Ship((*hit)->ToHostEmbedding().value());
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/gpu/device.h"

namespace epd {

class TierEmbedding;
using TierEmbeddingPtr = std::shared_ptr<const TierEmbedding>;

class TierEmbedding final : public ResidentBytes {
 public:
  ~TierEmbedding() override;
  TierEmbedding(const TierEmbedding&) = delete;
  TierEmbedding& operator=(const TierEmbedding&) = delete;

  const EmbeddingShape& shape() const { return shape_; }
  // The bytes the cache is charged: main plus deepstack.
  std::size_t nbytes() const { return shape_.nbytes(); }
  // kDevice: L1 (VRAM); kPinnedHost: L2 (or an L1 entry whose onboard fell back).
  MemoryKind where() const;
  // The copy that filled this entry has landed. Never blocks.
  bool ready() const;
  // Blocks until ready(). kInternal when the device reported the copy failed.
  Status Wait() const override;
  // Waits, then copies the bytes into a fresh host Embedding (for shipping).
  // Errors: as Wait(), or kInternal for a failed device->host copy.
  StatusOr<Embedding> ToHostEmbedding() const;

  // ResidentBytes: "device" or "pinned_host"; CopyToHost waits, then copies
  // main and deepstack into the caller's ranges (errors as ToHostEmbedding,
  // plus kInvalidArgument for ranges of the wrong size).
  std::string_view location() const override;
  const std::byte* data() const override { return buffer_.data(); }
  Status CopyToHost(std::span<std::byte> main, std::span<std::byte> deepstack) const override;

 private:
  friend StatusOr<TierEmbeddingPtr> UploadEmbedding(Device&, EmbeddingPtr, MemoryKind);
  friend StatusOr<TierEmbeddingPtr> OffloadEmbedding(Device&, const TierEmbeddingPtr&);
  friend StatusOr<TierEmbeddingPtr> OnboardEmbedding(Device&, const TierEmbeddingPtr&);
  friend StatusOr<TierEmbeddingPtr> AdoptDeviceRows(Device&, const DeviceRows&);
  struct Private {};
  // The one copy behind OffloadEmbedding (to kPinnedHost) and
  // OnboardEmbedding (to kDevice); `what` names the caller in errors.
  static StatusOr<TierEmbeddingPtr> CopyBetweenTiers(Device& device, const TierEmbeddingPtr& src, MemoryKind to,
                                                     const char* what);

 public:
  // Use the functions below; public only for std::make_shared.
  TierEmbedding(Private, Device* device, EmbeddingShape shape, DeviceBuffer buffer, EventPtr filled);

 private:
  Device* const device_;
  const EmbeddingShape shape_;
  DeviceBuffer buffer_;
  const EventPtr filled_;  // null: ready at construction
  mutable std::atomic<bool> ready_cache_{false};
};

// Copies a host Embedding into a new entry in `where` (kDevice: an async
// H2D on Stream::kOnboard, the host embedding held until it lands;
// kPinnedHost: a memcpy, ready at once). kInvalidArgument when emb is null
// or its byte sizes do not match its shape; kResourceExhausted when the
// memory is full; kInternal for a device failure.
StatusOr<TierEmbeddingPtr> UploadEmbedding(Device& device, EmbeddingPtr emb, MemoryKind where = MemoryKind::kDevice);

// Device -> pinned host (see the header comment). `src` in host memory is
// returned as is. kInvalidArgument for a null src; kResourceExhausted when
// the pinned pool has no block; kInternal for a device failure.
StatusOr<TierEmbeddingPtr> OffloadEmbedding(Device& device, const TierEmbeddingPtr& src);
// Pinned host -> device. `src` on the device is returned as is.
// kInvalidArgument for a null src; kResourceExhausted when device memory is
// full; kInternal for a device failure.
StatusOr<TierEmbeddingPtr> OnboardEmbedding(Device& device, const TierEmbeddingPtr& src);

// Copies rows already in device memory (one item of a device-resident tower
// output) into a new L1 entry: device -> device on Stream::kOnboard, with
// rows.owner held until the copy lands. The rows must be complete (the
// producer synchronised). kInvalidArgument for a negative shape or null
// pointers with bytes to copy; kResourceExhausted when device memory is
// full; kInternal for a device failure.
StatusOr<TierEmbeddingPtr> AdoptDeviceRows(Device& device, const DeviceRows& rows);

// What the copy functions did. Plain counters: see Thread safety above.
struct DeviceTierStats {
  std::uint64_t offloads = 0;  // device -> host copies enqueued
  std::uint64_t offload_bytes = 0;
  std::uint64_t offload_dropped = 0;  // pinned pool had no block: victim dropped
  std::uint64_t onboards = 0;         // host -> device copies enqueued
  std::uint64_t onboard_bytes = 0;
  std::uint64_t onboard_fallbacks = 0;  // device memory full: served from pinned memory
  std::uint64_t adopts = 0;             // tower rows copied device -> device into L1
  std::uint64_t adopt_bytes = 0;
  std::uint64_t adopt_fallbacks = 0;  // device memory full: rows copied to host instead
};

using TierCopyFn = std::function<TierEmbeddingPtr(const TierEmbeddingPtr&)>;

// The `to_host` and `to_device` callables of TieredEmbeddingCache. `device`
// (and `stats` when given) must outlive the returned function.
TierCopyFn MakeOffloadFn(Device& device, DeviceTierStats* stats = nullptr);
TierCopyFn MakeOnboardFn(Device& device, DeviceTierStats* stats = nullptr);

// WorkerOptions::to_host, to_device and adopt_device_rows for a worker whose
// L1 lives on `device` (epd/worker/encode_worker.h):
//   to_host            demotion: an Embedding resident in VRAM -> one in
//                      pinned memory (OffloadEmbedding); null (the victim is
//                      dropped) when the pinned pool has no block. A host or
//                      pinned Embedding is returned as is.
//   to_device          promotion: pinned -> VRAM (OnboardEmbedding); the
//                      pinned entry itself when VRAM is full. A host or VRAM
//                      Embedding is returned as is.
//   adopt_device_rows  a tower item's device rows -> an Embedding resident in
//                      VRAM (AdoptDeviceRows). When VRAM is full it copies
//                      the rows to a host Embedding instead (counted in
//                      adopt_fallbacks), so the item is still delivered.
// Each Embedding made keeps the grid (Embedding::grid, DeviceRows::grid) of
// the one it came from.
// to_host / to_device throw epd::Error(kInternal) for a device failure;
// adopt_device_rows returns it. `device` and `stats` must outlive the hooks,
// and `device` every Embedding they made (cached or delivered); all three
// must run on one thread at a time (the worker's owner thread).
struct EmbeddingTierHooks {
  std::function<EmbeddingPtr(const EmbeddingPtr&)> to_host;
  std::function<EmbeddingPtr(const EmbeddingPtr&)> to_device;
  std::function<StatusOr<EmbeddingPtr>(const DeviceRows&)> adopt_device_rows;
};
EmbeddingTierHooks MakeEmbeddingTierHooks(Device& device, DeviceTierStats* stats = nullptr);

// How much memory a Device must hand out for a tier of `l1_bytes` in device
// memory over `l2_bytes` in pinned host memory: the one sizing rule of the
// GPU tier, used by OpenGpuTier (epd/gpu_cuda/cuda_device.h), hence by `epd-encode
// --device cuda` and the GPU replay benchmark.
//   pinned_pool_bytes   = l2 + max(l2 / 16, 64 MiB): a demotion allocates its
//                         pinned block before L2 evicts to make room, so the
//                         pool needs more than L2 (docs/GPU.md, "Sizing the
//                         pool"); the slack also absorbs the pool's
//                         fragmentation.
//   device_bytes_limit  = l1 + max(l1 / 4, 256 MiB): L1 plus the copies in
//                         flight (a victim's VRAM is freed only once its
//                         offload lands, and adopted rows are allocated
//                         before L1 evicts), capped so the tier never takes
//                         the tower's activations. 256 MiB holds one full
//                         batch of 8192 post-merge tokens at hidden 2048 with
//                         two deepstack layers in float32 (192 MiB).
// Both in bytes. Never fails; O(1).
struct GpuTierSizing {
  std::size_t pinned_pool_bytes = 0;
  std::size_t device_bytes_limit = 0;
};
GpuTierSizing SizeGpuTier(std::size_t l1_bytes, std::size_t l2_bytes);

}  // namespace epd
