// src/client/shm_rows.h (tests only): the rows a reply by reference points
// at, read through a fresh read-only mapping of the server's arena, as a
// client in another process would (ShmMapping). For the server tests
// that compare them with the inline bytes.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "epd/v1/encoder.grpc.pb.h"
#include "shm_mapping.h"

namespace epd::testing {

// The `ref.length()` bytes at `ref.offset()`; "" (and a test failure) when
// the segment cannot be mapped.
inline std::string ShmRows(const v1::ShmRef& ref) {
  StatusOr<std::shared_ptr<const internal::ShmMapping>> m =
      internal::ShmMapping::Open(static_cast<pid_t>(ref.pid()), ref.fd(), ref.segment(), ref.segment_bytes());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return "";
  return std::string(reinterpret_cast<const char*>((*m)->data() + ref.offset()), ref.length());
}

}  // namespace epd::testing
