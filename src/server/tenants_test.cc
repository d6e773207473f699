// The tenant units alone: the namespace key (against HMAC written out from
// RFC 2104 over plain SHA-256), who a caller is (tenants.h), subject fields,
// and the per-tenant counters with their label folding (tenant_stats.h).
#include "tenants.h"

#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <string>
#include <vector>

#include "epd/media/tenant_key.h"
#include "tenant_stats.h"

namespace epd::internal {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes Sha(const Bytes& m) {
  Bytes d(32);
  SHA256(m.data(), m.size(), d.data());
  return d;
}

// HMAC-SHA256 by its definition (RFC 2104, block size 64).
Bytes HmacByDefinition(Bytes key, const Bytes& msg) {
  if (key.size() > 64) key = Sha(key);
  key.resize(64, 0);
  Bytes inner, outer;
  for (std::uint8_t b : key) inner.push_back(b ^ 0x36);
  for (std::uint8_t b : key) outer.push_back(b ^ 0x5c);
  inner.insert(inner.end(), msg.begin(), msg.end());
  const Bytes ih = Sha(inner);
  outer.insert(outer.end(), ih.begin(), ih.end());
  return Sha(outer);
}

void PutField(Bytes& out, const std::string& v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>((v.size() >> (8 * i)) & 0xff));
  out.insert(out.end(), v.begin(), v.end());
}

ContentKey SomeKey(std::uint8_t seed) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return k;
}

std::span<const std::uint8_t> AsSpan(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

TEST(NamespacedContentKeyTest, IsHmacSha256OverDomainNamespaceAndKey) {
  const std::string secret = "0123456789abcdef-cluster-secret";
  const ContentKey key = SomeKey(3);
  Bytes msg;
  PutField(msg, "epd/key/namespace/v1");
  PutField(msg, "tenant:alice");
  msg.insert(msg.end(), key.bytes.begin(), key.bytes.end());
  const Bytes want = HmacByDefinition(Bytes(secret.begin(), secret.end()), msg);
  const ContentKey got = NamespacedContentKey(AsSpan(secret), "tenant:alice", key);
  EXPECT_EQ(Bytes(got.bytes.begin(), got.bytes.end()), want);
  // A secret longer than the block is hashed first, as HMAC says.
  const std::string long_secret(100, 'z');
  const ContentKey got_long = NamespacedContentKey(AsSpan(long_secret), "tenant:alice", key);
  const Bytes want_long = HmacByDefinition(Bytes(long_secret.begin(), long_secret.end()), msg);
  EXPECT_EQ(Bytes(got_long.bytes.begin(), got_long.bytes.end()), want_long);
}

TEST(NamespacedContentKeyTest, NamespaceSecretAndKeyEachChangeIt) {
  const std::string s1 = "secret-number-one", s2 = "secret-number-two";
  const ContentKey k = SomeKey(1);
  const ContentKey a = NamespacedContentKey(AsSpan(s1), "tenant:a", k);
  EXPECT_NE(a, k);
  EXPECT_NE(a, NamespacedContentKey(AsSpan(s1), "tenant:b", k));
  EXPECT_NE(a, NamespacedContentKey(AsSpan(s2), "tenant:a", k));
  EXPECT_NE(a, NamespacedContentKey(AsSpan(s1), "tenant:a", SomeKey(2)));
  EXPECT_EQ(a, NamespacedContentKey(AsSpan(s1), "tenant:a", k));  // deterministic: servers agree
}

ServerOptions TwoTenants() {
  ServerOptions o;
  o.tenant_tokens = {{"tok-a", "alice", false}, {"tok-b", "bob", false}, {"tok-op", "ops", true}};
  o.tenant_secret = "a-secret-of-at-least-16-bytes";
  o.public_readers = {"alice", "bob"};
  return o;
}

TEST(TenantDirectoryTest, TheTokenNamesTheTenantWhateverTheHeaderSays) {
  auto d = TenantDirectory::Create(TwoTenants());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  StatusOr<Caller> c = (*d)->Identify(std::string("Bearer tok-a"), std::string("bob"), std::nullopt, "ipv4:1.2.3.4");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tenant, "alice");
  EXPECT_TRUE(c->named_by_credential);
  EXPECT_FALSE(c->is_operator);
  EXPECT_EQ(c->share, "tenant:alice");
  ASSERT_TRUE(c->key_namespace.has_value());
  EXPECT_EQ(c->key_namespace->name, "tenant:alice");
  EXPECT_TRUE(c->key_namespace->public_allowed);
  StatusOr<Caller> op = (*d)->Identify(std::string("Bearer tok-op"), std::nullopt, std::nullopt, "ipv4:1.2.3.4");
  ASSERT_TRUE(op.ok());
  EXPECT_TRUE(op->is_operator);
  EXPECT_FALSE(op->key_namespace->public_allowed);  // "ops" is not a public reader
}

TEST(TenantDirectoryTest, AnUnknownOrMissingTokenIsRefused) {
  auto d = TenantDirectory::Create(TwoTenants());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->Identify(std::string("Bearer tok-c"), std::nullopt, std::nullopt, "p").status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ((*d)->Identify(std::nullopt, std::string("alice"), std::nullopt, "p").status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ((*d)->Identify(std::string("tok-a"), std::nullopt, std::nullopt, "p").status().code(),
            StatusCode::kUnauthenticated);
}

TEST(TenantDirectoryTest, SaltedByDefaultWithTwoTenantsAndRefusedWithoutASecret) {
  ServerOptions o = TwoTenants();
  o.tenant_secret.clear();
  auto d = TenantDirectory::Create(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("--tenant-secret-file"), std::string::npos) << d.status().message();
  o.tenant_isolation = TenantIsolation::kNone;
  auto none = TenantDirectory::Create(o);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)->salted());
  // One tenant: auto means none; the single token is tenant "default", an operator.
  ServerOptions one;
  one.auth_token = "only";
  auto single = TenantDirectory::Create(one);
  ASSERT_TRUE(single.ok());
  EXPECT_FALSE((*single)->salted());
  StatusOr<Caller> c = (*single)->Identify(std::string("Bearer only"), std::nullopt, std::nullopt, "ipv4:1.2.3.4");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tenant, "default");
  EXPECT_TRUE(c->is_operator);
  EXPECT_FALSE(c->named_by_credential);  // every client holds it: the fair order is today's
  EXPECT_EQ(c->share, "ipv4:1.2.3.4");
}

TEST(TenantDirectoryTest, BadTablesAreRefused) {
  ServerOptions o = TwoTenants();
  o.tenant_tokens.push_back({"tok-a", "carol", false});
  EXPECT_EQ(TenantDirectory::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = TwoTenants();
  o.tenant_tokens.push_back({"tok-x", "has space", false});
  EXPECT_EQ(TenantDirectory::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = TwoTenants();
  o.tenant_secret = "short";
  EXPECT_EQ(TenantDirectory::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(TenantDirectoryTest, TheHeaderNamesATenantOnlyWhenTrusted) {
  ServerOptions o;  // no credentials
  auto untrusted = TenantDirectory::Create(o);
  ASSERT_TRUE(untrusted.ok());
  StatusOr<Caller> c = (*untrusted)->Identify(std::nullopt, std::string("bob"), std::nullopt, "ipv4:9.9.9.9");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tenant, "default");
  EXPECT_EQ(c->share, "tenant:bob");  // the fair order's rule is today's
  EXPECT_TRUE(c->is_operator);        // a server without credentials
  o.trust_tenant_header = true;
  o.tenant_isolation = TenantIsolation::kSalted;
  o.tenant_secret = "sixteen-bytes-at-least";
  auto trusted = TenantDirectory::Create(o);
  ASSERT_TRUE(trusted.ok());
  c = (*trusted)->Identify(std::nullopt, std::string("bob"), std::nullopt, "ipv4:9.9.9.9");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tenant, "bob");
  EXPECT_FALSE(c->named_by_credential);
  EXPECT_EQ(c->key_namespace->name, "tenant:bob");
  EXPECT_EQ((*trusted)->Identify(std::nullopt, std::string("a b"), std::nullopt, "p").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TenantDirectoryTest, AClientCertificateNamesItsTenant) {
  ServerOptions o;
  o.tls_client_ca_pem = "(a CA: only its presence matters to the directory)";
  o.trust_tenant_header = true;
  auto d = TenantDirectory::Create(o);
  ASSERT_TRUE(d.ok());
  StatusOr<Caller> c = (*d)->Identify(std::nullopt, std::string("bob"), std::string("alice-svc"), "p");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tenant, "alice-svc");  // the certificate wins over a trusted header
  EXPECT_TRUE(c->named_by_credential);
  EXPECT_FALSE(c->is_operator);
}

TEST(SubjectFieldTest, ReadsOneFieldOrTheWholeSubject) {
  const std::string subject = "CN=svc-a,OU=team\\, west,O=acme";
  EXPECT_EQ(SubjectField(subject, "CN"), "svc-a");
  EXPECT_EQ(SubjectField(subject, "O"), "acme");
  EXPECT_EQ(SubjectField(subject, "OU"), "team\\, west");
  EXPECT_EQ(SubjectField(subject, "subject"), subject);
  EXPECT_EQ(SubjectField(subject, "L"), std::nullopt);
}

ItemResult Result(ItemSource source, bool ok = true) {
  ItemResult r;
  r.source = source;
  if (!ok) r.status = InvalidArgument("bad image");
  return r;
}

TEST(TenantStatsTest, CountsEachTenantApartAndFoldsLabelsPastTheCap) {
  TenantStats s(2, {"alice"});
  s.CountRequest("alice");
  s.CountItem("alice", Result(ItemSource::kL1));
  s.CountItem("alice", Result(ItemSource::kMiss));
  s.CountItem("bob", Result(ItemSource::kJoined));
  s.CountItem("carol", Result(ItemSource::kL3));
  s.CountItem("dave", Result(ItemSource::kL2, false));
  s.CountRefusal("dave");
  const TenantCounters a = s.Of("alice");
  EXPECT_EQ(a.requests, 1u);
  EXPECT_EQ(a.items, 2u);
  EXPECT_EQ(a.hits_l1, 1u);
  EXPECT_EQ(a.misses, 1u);
  EXPECT_EQ(s.Of("carol").hits_l3, 1u);  // exact, though folded on the page
  EXPECT_EQ(s.Of("dave").failed_items, 1u);
  const auto rows = s.Labelled();
  ASSERT_EQ(rows.size(), 3u);  // alice, bob, other
  EXPECT_EQ(rows.at("bob").joins, 1u);
  EXPECT_EQ(rows.at("other").items, 2u);  // carol + dave
  EXPECT_EQ(rows.at("other").refusals, 1u);
  const std::string page = s.Render();
  EXPECT_NE(page.find("epd_tenant_hits_l1_total{tenant=\"alice\"} 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_tenant_items_total{tenant=\"other\"} 2\n"), std::string::npos) << page;
  EXPECT_EQ(page.find("carol"), std::string::npos);
}

}  // namespace
}  // namespace epd::internal
