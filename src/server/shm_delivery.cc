#include "shm_delivery.h"

#include <cstring>
#include <string>

namespace epd::internal {

bool PlaceInArena(ShmArena& arena, const std::string& key, const Embedding& e, v1::EncodedItem* out,
                  std::uint64_t owner) {
  const std::uint64_t length = e.main.size() + e.deepstack.size();
  std::optional<ShmArena::Span> span = arena.Acquire(key, length);
  if (!span.has_value()) {
    arena.CountFallback();
    return false;
  }
  // The one copy on the server side, once per key while its span lives
  // (inline bytes are copied into every message); the client reads these
  // bytes where they are.
  if (span->fresh) {
    if (!e.main.empty()) std::memcpy(span->data, e.main.data(), e.main.size());
    if (!e.deepstack.empty()) std::memcpy(span->data + e.main.size(), e.deepstack.data(), e.deepstack.size());
    arena.Publish(*span);
  }
  v1::ShmRef* ref = out->mutable_shm();
  ref->set_segment(arena.segment());
  ref->set_pid(arena.pid());
  ref->set_fd(arena.fd());
  ref->set_segment_bytes(arena.capacity());
  ref->set_offset(span->offset);
  ref->set_length(length);
  ref->set_generation(span->generation);
  ref->set_lease_ms(arena.lease().count());
  if (owner != 0) ref->set_in_session(arena.Adopt(span->generation, owner));
  return true;
}

Status ReleaseShmLease(ShmArena* arena, const v1::ShmLease& lease) {
  if (arena == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "this server has no shared-memory arena (start it with --shm-arena-mb); there is nothing to release");
  }
  return arena->Release(lease.offset(), lease.generation());
}

}  // namespace epd::internal
