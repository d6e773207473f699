// See tenants.h.
#include "tenants.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "admission.h"

namespace epd::internal {
namespace {

constexpr std::size_t kMinSecretBytes = 16;
constexpr char kDefaultTenant[] = "default";

std::vector<TokenCheck::Entry> EntriesOf(const ServerOptions& o) {
  std::vector<TokenCheck::Entry> out;
  if (!o.auth_token.empty()) out.push_back({o.auth_token, TokenOwner{kDefaultTenant, true, true}});
  for (const TenantToken& t : o.tenant_tokens) out.push_back({t.token, TokenOwner{t.tenant, t.is_operator}});
  return out;
}

std::optional<std::string> MetadataValue(const grpc::ServerContextBase& ctx, const std::string& key) {
  if (key.empty()) return std::nullopt;
  const auto& md = ctx.client_metadata();
  const auto it = md.find(grpc::string_ref(key));
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

Status CheckTenantName(const std::string& name, const std::string& what) {
  bool ok = !name.empty() && name.size() <= 128;
  for (const char c : name) ok = ok && c > 0x20 && c <= 0x7e;
  if (ok) return Status::Ok();
  return InvalidArgument(what + " must be 1..128 bytes of printable ASCII without spaces (a tenant name); got " +
                         std::to_string(name.size()) + " bytes");
}

std::optional<std::string> SubjectField(const std::string& subject, const std::string& field) {
  if (field == "subject") return subject.empty() ? std::nullopt : std::optional<std::string>(subject);
  std::size_t start = 0;
  while (start <= subject.size()) {
    std::size_t end = start;
    while (end < subject.size() && !(subject[end] == ',' && (end == 0 || subject[end - 1] != '\\'))) ++end;
    const std::string part = subject.substr(start, end - start);
    const std::size_t eq = part.find('=');
    if (eq != std::string::npos && part.substr(0, eq) == field && eq + 1 < part.size()) return part.substr(eq + 1);
    start = end + 1;
  }
  return std::nullopt;
}

TenantDirectory::TenantDirectory(const ServerOptions& o, const std::vector<TokenCheck::Entry>& entries)
    : tokens_(entries),
      tenant_header_(o.tenant_metadata),
      trust_header_(o.trust_tenant_header),
      mutual_tls_(!o.tls_client_ca_pem.empty()),
      cert_field_(o.tls_tenant_field) {
  for (const TokenCheck::Entry& e : entries) configured_.insert(e.owner.tenant);
  for (const std::string& r : o.public_readers) {
    if (r == "*") all_public_ = true;
    public_readers_.insert(r);
  }
}

StatusOr<std::unique_ptr<TenantDirectory>> TenantDirectory::Create(const ServerOptions& o) {
  std::vector<TokenCheck::Entry> entries = EntriesOf(o);
  std::set<std::string> tokens, tenants;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "tenant token " + std::to_string(i + 1);
    if (entries[i].token.empty()) return InvalidArgument(at + " is empty");
    if (!tokens.insert(entries[i].token).second) {
      return InvalidArgument(at + " is listed twice (each token names one tenant)");
    }
    if (Status s = CheckTenantName(entries[i].owner.tenant, at + "'s tenant"); !s.ok()) return s;
    tenants.insert(entries[i].owner.tenant);
  }
  for (const std::string& r : o.public_readers) {
    if (r == "*") continue;
    if (Status s = CheckTenantName(r, "a public reader (--public-readers)"); !s.ok()) return s;
  }
  if (o.max_tenant_labels < 1) {
    return InvalidArgument("max_tenant_labels (--max-tenant-labels) must be >= 1, got " +
                           std::to_string(o.max_tenant_labels));
  }
  const bool salted = o.tenant_isolation == TenantIsolation::kSalted ||
                      (o.tenant_isolation == TenantIsolation::kAuto && tenants.size() > 1);
  std::unique_ptr<TenantDirectory> d(new TenantDirectory(o, entries));
  if (!salted) return d;
  if (o.tenant_secret.size() < kMinSecretBytes) {
    return InvalidArgument(
        std::string("tenant isolation is salted") +
        (o.tenant_isolation == TenantIsolation::kAuto ? " (more than one tenant is configured)" : "") +
        " and needs a secret of at least 16 bytes, the same on every server of the cluster: "
        "pass --tenant-secret-file (or --tenant-isolation none); got " +
        std::to_string(o.tenant_secret.size()) + " bytes");
  }
  d->secret_ = std::make_shared<const std::string>(o.tenant_secret);
  return d;
}

StatusOr<Caller> TenantDirectory::Identify(const std::optional<std::string>& authorization,
                                           const std::optional<std::string>& header,
                                           const std::optional<std::string>& cert_subject_field,
                                           const std::string& peer) const {
  Caller c;
  if (tokens_.enabled()) {
    StatusOr<TokenOwner> owner = tokens_.Owner(authorization);
    if (!owner.ok()) return owner.status();
    c.tenant = std::move(owner->tenant);
    c.is_operator = owner->is_operator;
    c.named_by_credential = !owner->shared;
  } else if (mutual_tls_ && cert_subject_field.has_value()) {
    if (Status s = CheckTenantName(*cert_subject_field, "the client certificate's " + cert_field_); !s.ok()) return s;
    c.tenant = *cert_subject_field;
    c.named_by_credential = true;
  } else if (trust_header_ && header.has_value()) {
    if (Status s = CheckTenantName(*header, "the metadata '" + tenant_header_ + "'"); !s.ok()) return s;
    c.tenant = *header;
  } else {
    c.tenant = kDefaultTenant;
  }
  // No credential of any kind on this server: every caller may read all.
  if (!tokens_.enabled() && !mutual_tls_) c.is_operator = true;
  if (c.named_by_credential) {
    c.share = "tenant:" + c.tenant;
  } else {
    StatusOr<std::string> share = TenantFrom(header, tenant_header_, peer);
    if (!share.ok()) return share.status();
    c.share = std::move(*share);
  }
  if (secret_ != nullptr) {
    c.key_namespace = KeyNamespace{secret_, "tenant:" + c.tenant, all_public_ || public_readers_.count(c.tenant) != 0};
  }
  return c;
}

StatusOr<Caller> TenantDirectory::Identify(const grpc::ServerContextBase& ctx) const {
  std::optional<std::string> cert;
  if (mutual_tls_ && !tokens_.enabled()) {
    const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    const char* property = cert_field_ == "CN" ? GRPC_X509_CN_PROPERTY_NAME : GRPC_X509_SUBJECT_PROPERTY_NAME;
    const std::vector<grpc::string_ref> values =
        auth != nullptr ? auth->FindPropertyValues(property) : std::vector<grpc::string_ref>{};
    if (!values.empty()) {
      const std::string v(values.front().data(), values.front().size());
      cert = cert_field_ == "CN" ? std::optional<std::string>(v) : SubjectField(v, cert_field_);
    }
  }
  return Identify(tokens_.enabled() ? AuthorizationOf(ctx) : std::nullopt, MetadataValue(ctx, tenant_header_), cert,
                  PeerWithoutPort(ctx.peer()));
}

}  // namespace epd::internal
