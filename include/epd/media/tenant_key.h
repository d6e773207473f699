// epd/media/tenant_key.h: the one function that moves a content key into a
// tenant's namespace (issue 25, "one namespace per tenant").
//
// A shared cache is a timing channel: a tenant whose image comes back as a
// hit has learned that someone else sent it. With tenant isolation on, every
// content key (epd/media/content_key.h) is replaced, before any cache, L3,
// shared-memory or CUDA IPC code sees it, by
//
//   NamespacedContentKey(secret, ns, key)
//     = HMAC-SHA256(secret, "epd/key/namespace/v1" || len(ns) || ns || key)
//
// (HMAC per RFC 2104 with SHA-256, OpenSSL's one-shot HMAC(); len is the
// namespace's byte length as uint64 little-endian, so ("ab", key) and
// ("a", "b" || key...) never hash the same bytes; `key` is its 32 bytes).
// Without the secret nobody, tenant or Redis reader, can map a content key
// to its namespaced key, nor tell two tenants' keys of one image apart from
// two random keys. The secret is the server's --tenant-secret-file, the same
// on every server of a cluster so that all of them (and their shared L3)
// agree on one key per (namespace, content).
//
// Namespace names are the server's choice: "tenant:<name>" for a tenant's
// own items, "public" for the shared namespace (docs/SECURITY.md). A
// namespaced key is an ordinary SHA-256-sized ContentKey; it never carries
// kFastKeyMarker (IsFastContentKey is false on it, short of a 2^-128 event).
//
// Cost: two SHA-256 compressions over about 100 bytes, about 1 us.
// Thread safety: pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "epd/core/content_key_type.h"

namespace epd {

// Domain tag hashed first (its bytes, length-prefixed).
inline constexpr std::string_view kNamespaceKeyDomain = "epd/key/namespace/v1";

// See the header comment. `secret` may be any length (HMAC hashes one longer
// than 64 bytes first); the server refuses fewer than 16 bytes. Throws
// epd::Error(kInternal) only if libcrypto fails.
ContentKey NamespacedContentKey(std::span<const std::uint8_t> secret, std::string_view ns, const ContentKey& key);

}  // namespace epd
