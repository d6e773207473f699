// src/server/request_id.h (internal): the request ids the server accepts and
// the ones it assigns.
//
// A request id shows up in error messages, logs and Stats, so it must be
// printable: a client id is 1..256 bytes of printable ASCII (0x20..0x7e),
// else INVALID_ARGUMENT. An empty id means "assign one": the server uses
// kAutoRequestIdPrefix + a counter, and refuses client ids that start with
// that prefix, so the two can never collide.
#pragma once

#include <cstdint>
#include <string>

#include "epd/core/status.h"

namespace epd::internal {

inline constexpr char kAutoRequestIdPrefix[] = "epd-auto-";
inline constexpr std::size_t kMaxRequestIdBytes = 256;

inline std::string AutoRequestId(std::uint64_t n) { return kAutoRequestIdPrefix + std::to_string(n); }

// OK for an empty id (the server assigns one) or a valid client id.
inline Status CheckClientRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return InvalidArgument("the request id is " + std::to_string(id.size()) + " bytes; at most " +
                           std::to_string(kMaxRequestIdBytes) + " are allowed");
  }
  for (std::size_t i = 0; i < id.size(); ++i) {
    const auto c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c > 0x7e) {
      return InvalidArgument("the request id has byte 0x" + std::string(1, "0123456789abcdef"[c >> 4]) +
                             std::string(1, "0123456789abcdef"[c & 15]) + " at offset " + std::to_string(i) +
                             "; ids must be printable ASCII");
    }
  }
  if (id.starts_with(kAutoRequestIdPrefix)) {
    return InvalidArgument("the request id '" + id + "' starts with '" + kAutoRequestIdPrefix +
                           "', which is reserved for ids the server assigns; choose another or send none");
  }
  return Status::Ok();
}

}  // namespace epd::internal
