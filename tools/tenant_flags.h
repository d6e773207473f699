// tools/tenant_flags.h: the tenant flags of `epd-encode serve`
// (docs/SECURITY.md): who the tenant is (--tokens-file, --tls-tenant-field,
// --trust-tenant-header), its key namespace (--tenant-isolation,
// --tenant-secret-file, --public-readers), the per-tenant metrics' label
// cap (--max-tenant-labels) and the misses' reply floor against the load
// channel (--miss-reply-floor-ms, ServerOptions::miss_reply_floor).
//
// A tokens file has one line per token: "<token> <tenant> [operator]",
// blank lines and lines starting with '#' ignored. It and the secret file
// are refused when every user of the machine may read or write them (mode
// o+r or o+w: chmod 600), or when they are not regular files, like
// --l3-key-file. The secret file's bytes are the HMAC secret (a trailing
// newline dropped), at least 16 bytes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/server/server.h"

namespace epd::cli {

struct TenantFlags {
  std::string tokens_file, tls_tenant_field = "CN", isolation = "auto", secret_file;
  bool trust_tenant_header = false;
  std::vector<std::string> public_readers;
  int max_tenant_labels = 32;
  std::int64_t miss_reply_floor_ms = 0;
};
void AddTenantFlags(CLI::App& cmd, TenantFlags& f);
// kInvalidArgument naming the flag and the line for a malformed file, a
// file others may read, or a short secret; kNotFound for an unreadable one.
Status ApplyTenantFlags(const TenantFlags& f, ServerOptions& options);

// The lines of a tokens file's text (`source` names it in errors).
StatusOr<std::vector<TenantToken>> ParseTokensFile(const std::string& text, const std::string& source);

}  // namespace epd::cli
