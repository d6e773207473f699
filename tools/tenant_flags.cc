#include "tenant_flags.h"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "flag_checks.h"
namespace epd::cli {
namespace {

constexpr std::size_t kMaxFileBytes = 1 << 20;

// A secret-holding file's text, refused when others may read or write it.
StatusOr<std::string> ReadPrivate(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status(StatusCode::kNotFound, flag + " " + path + ": cannot be read");
  if (!S_ISREG(st.st_mode)) return InvalidArgument(flag + " " + path + ": not a regular file");
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    return InvalidArgument(flag + " " + path +
                           ": every user of this machine may read or write it; chmod 600 (or 640) it");
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxFileBytes) return InvalidArgument(flag + " " + path + ": over 1 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, flag + " " + path + ": cannot be read");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

StatusOr<std::vector<TenantToken>> ParseTokensFile(const std::string& text, const std::string& source) {
  std::vector<TenantToken> out;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty() || w[0][0] == '#') continue;
    const std::string at = source + " line " + std::to_string(n);
    if (w.size() < 2 || w.size() > 3 || (w.size() == 3 && w[2] != "operator")) {
      return InvalidArgument(at + ": expected \"<token> <tenant> [operator]\", got " + std::to_string(w.size()) +
                             " words");
    }
    out.push_back({w[0], w[1], w.size() == 3});
  }
  if (out.empty()) return InvalidArgument(source + ": no tokens");
  return out;
}

void AddTenantFlags(CLI::App& cmd, TenantFlags& f) {
  cmd.add_option("--tokens-file", f.tokens_file,
                 "bearer tokens, one \"<token> <tenant> [operator]\" a line: each call's token names its tenant "
                 "(mode 600)");
  cmd.add_option("--tls-tenant-field", f.tls_tenant_field,
                 "with --tls-client-ca and no tokens: the client certificate's subject field naming its tenant "
                 "(CN, O, OU, ... or 'subject' for the whole subject)")
      ->capture_default_str();
  cmd.add_flag("--trust-tenant-header", f.trust_tenant_header,
               "let --tenant-header name the tenant where no credential does (trusted clients only)");
  cmd.add_option("--tenant-isolation", f.isolation,
                 "one cache namespace per tenant (salted) or one for all (none); auto = salted when the tokens "
                 "name more than one tenant")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "salted"}));
  cmd.add_option("--tenant-secret-file", f.secret_file,
                 "the key-namespace HMAC secret (>= 16 bytes, mode 600), the same on every server of a cluster");
  cmd.add_option("--public-readers", f.public_readers,
                 "tenants whose items marked public share one 'public' namespace (comma-separated, or '*')")
      ->delimiter(',');
  cmd.add_option("--max-tenant-labels", f.max_tenant_labels,
                 "per-tenant metrics: most tenant labels; the rest are folded into 'other'")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd.add_option("--miss-reply-floor-ms", f.miss_reply_floor_ms,
                 "send no miss's reply sooner than this after its call arrived, so that a miss takes the same time "
                 "whether or not other tenants keep the tower busy (docs/SECURITY.md); 0 = off")
      ->capture_default_str()
      ->check(Integer(0, 600000));
}

Status ApplyTenantFlags(const TenantFlags& f, ServerOptions& o) {
  if (!f.tokens_file.empty()) {
    StatusOr<std::string> text = ReadPrivate(f.tokens_file, "--tokens-file");
    if (!text.ok()) return text.status();
    StatusOr<std::vector<TenantToken>> tokens = ParseTokensFile(*text, "--tokens-file " + f.tokens_file);
    if (!tokens.ok()) return tokens.status();
    o.tenant_tokens = std::move(*tokens);
  }
  if (!f.secret_file.empty()) {
    StatusOr<std::string> secret = ReadPrivate(f.secret_file, "--tenant-secret-file");
    if (!secret.ok()) return secret.status();
    while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) secret->pop_back();
    o.tenant_secret = std::move(*secret);
  }
  o.tls_tenant_field = f.tls_tenant_field;
  o.trust_tenant_header = f.trust_tenant_header;
  o.tenant_isolation = f.isolation == "salted" ? TenantIsolation::kSalted
                       : f.isolation == "none" ? TenantIsolation::kNone
                                               : TenantIsolation::kAuto;
  o.public_readers = f.public_readers;
  o.max_tenant_labels = f.max_tenant_labels;
  o.miss_reply_floor = std::chrono::milliseconds(f.miss_reply_floor_ms);
  return Status::Ok();
}

}  // namespace epd::cli
