// src/client/shm_mapping.h (internal to epd::client): a read-only mapping of
// an encode server's shared-memory arena (docs/SHM.md, src/server/shm_arena.h).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "epd/core/status.h"

namespace epd::internal {

class ShmMapping {
 public:
  // Opens /proc/<pid>/fd/<fd> read-only after checking that it links to the
  // arena named after `segment`, and maps `segment_bytes` of it with
  // PROT_READ. Errors: kPermissionDenied when the kernel refuses the open
  // (another user: the arena is for the server's own user); kFailedPrecondition
  // when the descriptor is not that arena (a server on another host or in
  // another PID namespace) or is smaller than `segment_bytes`; kUnavailable
  // for other failures of open or mmap (the message names errno).
  static StatusOr<std::shared_ptr<const ShmMapping>> Open(pid_t pid, int fd, std::uint64_t segment,
                                                          std::uint64_t segment_bytes);
  // Open, but once per process: while any holder keeps the mapping of
  // `segment` (at least `segment_bytes` long) alive, every caller gets that
  // same mapping. So the clients of one process (e.g. one per connection)
  // pay for mapping and pre-faulting the arena once, not once each: the
  // first reply to each new client would otherwise stall for the
  // MAP_POPULATE of the whole arena (tens of ms for 256 MiB). Errors as Open.
  // Thread-safe; concurrent first calls for one segment map it once.
  static StatusOr<std::shared_ptr<const ShmMapping>> Shared(pid_t pid, int fd, std::uint64_t segment,
                                                            std::uint64_t segment_bytes);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  const std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t segment() const { return segment_; }

 private:
  ShmMapping() = default;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t segment_ = 0;
};

}  // namespace epd::internal
