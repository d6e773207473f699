// tools/security_flags.h: the TLS and bearer-token flags of `epd-encode
// serve` and `epd-encode client` (docs/SERVER.md, "Production setup").
//
// The flags name files; Apply* reads them into the PEM text and token that
// ServerOptions / ClientOptions take. A token file holds the token alone; a
// trailing newline (as `echo` or an editor leaves) is dropped.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "epd/client/client.h"
#include "epd/core/status.h"
#include "epd/server/server.h"

namespace epd::cli {

struct ServerSecurityFlags {
  std::string tls_cert, tls_key, tls_client_ca, auth_token_file;
};
void AddServerSecurityFlags(CLI::App& cmd, ServerSecurityFlags& f);
// kNotFound for a file that cannot be read; kInvalidArgument for an empty
// token file.
Status ApplyServerSecurityFlags(const ServerSecurityFlags& f, ServerOptions& options);

struct ClientSecurityFlags {
  bool tls = false;
  std::string tls_ca, tls_cert, tls_key, tls_server_name, auth_token_file;
  std::string tenant, tenant_header = "x-epd-tenant";
};
void AddClientSecurityFlags(CLI::App& cmd, ClientSecurityFlags& f);
Status ApplyClientSecurityFlags(const ClientSecurityFlags& f, ClientOptions& options);

}  // namespace epd::cli
