// src/server/shm_delivery.h (internal to epd::server): what DELIVERY_SHM adds
// to the Encode and Release RPCs, between the proto messages and ShmArena.
#pragma once

#include <cstdint>
#include <string>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/v1/encoder.pb.h"
#include "shm_arena.h"

namespace epd::internal {

// Leases the span of `arena` holding the rows of content key `key` (32 key
// bytes; empty = never shared), copying `e`'s rows (main, then deepstack)
// into a new span when none holds them, and describes it in out->shm. A
// nonzero `owner` (an arena owner of the call's lease session,
// shm_session.h) gets the lease (ShmArena::Adopt); out->shm().in_session
// says whether it took. False when the arena has no room: nothing is
// written, the fallback is counted, and the caller sends the bytes inline.
// REQUIRES: e is on the host and is the embedding of `key`.
bool PlaceInArena(ShmArena& arena, const std::string& key, const Embedding& e, v1::EncodedItem* out,
                  std::uint64_t owner = 0);

// Releases one shared-memory lease (kind LEASE_KIND_SHM). FailedPrecondition
// when `arena` is null (the server has none) or the lease matches nothing
// (ShmArena::Release, counted there).
Status ReleaseShmLease(ShmArena* arena, const v1::ShmLease& lease);

}  // namespace epd::internal
