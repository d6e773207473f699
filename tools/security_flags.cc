#include "security_flags.h"

#include <fstream>
#include <sstream>

namespace epd::cli {
namespace {

StatusOr<std::string> ReadAll(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, std::string(flag) + ": cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Reads `path` into `out` unless the path is empty.
Status ReadInto(const std::string& path, const char* flag, std::string& out) {
  if (path.empty()) return Status::Ok();
  StatusOr<std::string> text = ReadAll(path, flag);
  if (!text.ok()) return text.status();
  out = std::move(*text);
  return Status::Ok();
}

Status ReadToken(const std::string& path, std::string& out) {
  if (path.empty()) return Status::Ok();
  StatusOr<std::string> text = ReadAll(path, "--auth-token-file");
  if (!text.ok()) return text.status();
  std::string token = std::move(*text);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) return InvalidArgument("--auth-token-file: " + path + " is empty");
  out = std::move(token);
  return Status::Ok();
}

}  // namespace

void AddServerSecurityFlags(CLI::App& cmd, ServerSecurityFlags& f) {
  auto* cert =
      cmd.add_option("--tls-cert", f.tls_cert, "serve TLS with this PEM certificate (chain)")->check(CLI::ExistingFile);
  auto* key = cmd.add_option("--tls-key", f.tls_key, "the PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
  cmd.add_option("--tls-client-ca", f.tls_client_ca, "mutual TLS: require client certificates signed by this PEM CA")
      ->check(CLI::ExistingFile)
      ->needs(cert);
  cmd.add_option("--auth-token-file", f.auth_token_file,
                 "require \"authorization: Bearer <token>\" on Encode/Health/Stats, token read from this file")
      ->check(CLI::ExistingFile);
}

Status ApplyServerSecurityFlags(const ServerSecurityFlags& f, ServerOptions& o) {
  if (Status s = ReadInto(f.tls_cert, "--tls-cert", o.tls_cert_pem); !s.ok()) return s;
  if (Status s = ReadInto(f.tls_key, "--tls-key", o.tls_key_pem); !s.ok()) return s;
  if (Status s = ReadInto(f.tls_client_ca, "--tls-client-ca", o.tls_client_ca_pem); !s.ok()) return s;
  return ReadToken(f.auth_token_file, o.auth_token);
}

void AddClientSecurityFlags(CLI::App& cmd, ClientSecurityFlags& f) {
  cmd.add_flag("--tls", f.tls, "connect with TLS (implied by --tls-ca and --tls-cert)");
  cmd.add_option("--tls-ca", f.tls_ca, "PEM CA the server's certificate must chain to [system trust store]")
      ->check(CLI::ExistingFile);
  auto* cert =
      cmd.add_option("--tls-cert", f.tls_cert, "mutual TLS: this client's PEM certificate")->check(CLI::ExistingFile);
  auto* key = cmd.add_option("--tls-key", f.tls_key, "the PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
  cmd.add_option("--tls-server-name", f.tls_server_name,
                 "name to check the server's certificate against instead of the --server host");
  cmd.add_option("--auth-token-file", f.auth_token_file, "send \"authorization: Bearer <token>\" from this file")
      ->check(CLI::ExistingFile);
  cmd.add_option("--tenant", f.tenant,
                 "send this tenant name under --tenant-header (names the tenant only on a server with "
                 "--trust-tenant-header and no credential naming one)");
  cmd.add_option("--tenant-header", f.tenant_header, "metadata key --tenant goes under")->capture_default_str();
}

Status ApplyClientSecurityFlags(const ClientSecurityFlags& f, ClientOptions& o) {
  o.tls = f.tls || !f.tls_server_name.empty();
  if (Status s = ReadInto(f.tls_ca, "--tls-ca", o.tls_root_certs_pem); !s.ok()) return s;
  if (Status s = ReadInto(f.tls_cert, "--tls-cert", o.tls_client_cert_pem); !s.ok()) return s;
  if (Status s = ReadInto(f.tls_key, "--tls-key", o.tls_client_key_pem); !s.ok()) return s;
  o.tls_server_name = f.tls_server_name;
  o.tenant = f.tenant;
  o.tenant_header = f.tenant_header;
  return ReadToken(f.auth_token_file, o.auth_token);
}

}  // namespace epd::cli
