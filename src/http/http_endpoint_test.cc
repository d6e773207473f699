// HttpEndpoint against real clients on loopback: routes and error pages,
// the body limit, slow heads and bodies, idle and kept-alive connections
// (which must hold no thread), the park's bound, pipelining, TLS and the
// bearer check. Every expected value is written out here, not derived from
// the endpoint.
#include "epd/http/http_endpoint.h"

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "http_test_util.h"

namespace epd {
namespace {

using std::chrono::milliseconds;
using namespace epd::testing_http;

HttpResponse Json(int status, const std::string& message) {
  return HttpResponse{status, "application/json", "{\"error\":\"" + message + "\"}"};
}

std::vector<HttpRoute> Routes() {
  return {{"GET", "/health", false,
           [](const HttpRequest&) {
             return HttpResponse{200, "text/plain", "ok\n"};
           }},
          {"POST", "/echo", true, [](const HttpRequest& r) {
             return HttpResponse{200, "text/plain", std::string(r.body) + "|" + r.Header("x-tag").value_or("-")};
           }}};
}

HttpEndpointOptions Options() {
  HttpEndpointOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.error_page = Json;
  return o;
}

std::unique_ptr<HttpEndpoint> StartOrDie(HttpEndpointOptions o, std::vector<HttpRoute> routes = Routes()) {
  auto ep = HttpEndpoint::Start(std::move(o), std::move(routes));
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  return ep.ok() ? std::move(*ep) : nullptr;
}

const char kGetHealth[] = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";

TEST(HttpEndpointTest, RoutesAnswerAndTheRestGetErrorPagesInTheEndpointsFormat) {
  auto ep = StartOrDie(Options());
  const std::string ok = Exchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(ok.substr(0, 15), "HTTP/1.1 200 OK") << ok;
  EXPECT_EQ(ok.substr(ok.size() - 3), "ok\n");
  const std::string echo =
      Exchange(ep->port(),
               "POST /echo HTTP/1.1\r\nHost: t\r\nX-Tag: blue\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  EXPECT_EQ(echo.substr(echo.size() - 10), "hello|blue") << echo;
  const std::string missing = Exchange(ep->port(), "GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(missing.substr(0, 22), "HTTP/1.1 404 Not Found") << missing;
  EXPECT_NE(missing.find("{\"error\":\"no route for GET /nope\"}"), std::string::npos) << missing;
  const std::string wrong =
      Exchange(ep->port(), "POST /health HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(wrong.substr(0, 12), "HTTP/1.1 405") << wrong;
  EXPECT_NE(wrong.find("Allow: GET"), std::string::npos) << wrong;
  const std::string garbage = Exchange(ep->port(), "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_EQ(garbage.substr(0, 12), "HTTP/1.1 400") << garbage;
  EXPECT_NE(garbage.find("malformed HTTP request"), std::string::npos) << garbage;
}

TEST(HttpEndpointTest, ABodyOverTheLimitGets413BeforeItIsRead) {
  HttpEndpointOptions o = Options();
  o.max_body_bytes = 1000;
  auto ep = StartOrDie(o);
  const std::string r = Exchange(ep->port(), "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n");
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 413") << r;
  EXPECT_NE(r.find("the request body is over 1000 bytes"), std::string::npos) << r;
  EXPECT_EQ(Exchange(ep->port(), std::string(kGetHealth)).substr(0, 15), "HTTP/1.1 200 OK");
}

TEST(HttpEndpointTest, ASlowBodyGets408AndTheEndpointKeepsServing) {
  HttpEndpointOptions o = Options();
  o.body_timeout = milliseconds(300);
  o.threads = 1;
  auto ep = StartOrDie(o);
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nonly ten.."));
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 408") << r;
  EXPECT_NE(r.find("the request body did not arrive within 0.3 s"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(Exchange(ep->port(), std::string(kGetHealth)).substr(0, 15), "HTTP/1.1 200 OK");
}

TEST(HttpEndpointTest, ATrickledHeadIsClosedWith408AtTheHeaderTimeout) {
  HttpEndpointOptions o = Options();
  o.header_timeout = milliseconds(300);
  auto ep = StartOrDie(o);
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd, "GET /health HTTP/1.1\r\nHo"));
  const std::string r = ReadResponse(fd);
  EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 408") << r;
  EXPECT_NE(r.find("the request head did not arrive within 0.3 s"), std::string::npos) << r;
  EXPECT_TRUE(ClosedByServer(fd, 5000));
  close(fd);
  const int silent = Connect(ep->port());
  EXPECT_TRUE(ClosedByServer(silent, 5000));  // closed without a word
  close(silent);
  EXPECT_EQ(ep->Stats().header_timeouts, 2u);
}

// One pool thread, 150 connections that sent nothing and 30 kept alive
// after a request: all wait in the park, none holds the thread, so a new
// request is answered at once and they all stay open.
TEST(HttpEndpointTest, IdleConnectionsHoldNoThread) {
  HttpEndpointOptions o = Options();
  o.threads = 1;
  o.header_timeout = std::chrono::minutes(10);
  o.idle_timeout = std::chrono::minutes(10);
  auto ep = StartOrDie(o);
  std::vector<int> idle;
  idle.reserve(150);
  for (int i = 0; i < 150; ++i) idle.push_back(Connect(ep->port()));
  for (int i = 0; i < 30; ++i) {
    const int fd = Connect(ep->port());
    ASSERT_TRUE(SendAll(fd, kGetHealth));
    ASSERT_EQ(ReadResponse(fd).substr(0, 15), "HTTP/1.1 200 OK");
    idle.push_back(fd);
  }
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(Exchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").substr(0, 15),
              "HTTP/1.1 200 OK");
  }
  EXPECT_EQ(ep->Stats().parked, 180);
  for (int fd : idle) {
    EXPECT_FALSE(ClosedByServer(fd));
    close(fd);
  }
}

TEST(HttpEndpointTest, AFullParkClosesTheConnectionNearestItsDeadline) {
  HttpEndpointOptions o = Options();
  o.max_idle_connections = 5;
  o.header_timeout = std::chrono::minutes(10);
  auto ep = StartOrDie(o);
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) {
    fds.push_back(Connect(ep->port()));
    std::this_thread::sleep_for(milliseconds(20));  // distinct deadlines, in connect order
  }
  EXPECT_TRUE(ClosedByServer(fds[0], 5000));
  for (int i = 1; i < 6; ++i) EXPECT_FALSE(ClosedByServer(fds[i])) << i;
  EXPECT_EQ(ep->Stats().evicted, 1u);
  for (int fd : fds) close(fd);
}

TEST(HttpEndpointTest, PipelinedRequestsAreAnsweredInOrderOnOneConnection) {
  auto ep = StartOrDie(Options());
  const int fd = Connect(ep->port());
  ASSERT_TRUE(SendAll(fd,
                      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\none"
                      "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\ntwo"));
  std::string got;
  char buf[4096];
  while (got.find("two|-") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<std::size_t>(n));
  }
  EXPECT_LT(got.find("one|-"), got.find("two|-")) << got;
  EXPECT_EQ(got.find("HTTP/1.1 200 OK"), 0u) << got;
  EXPECT_NE(got.find("HTTP/1.1 200 OK", 1), std::string::npos) << got;
  close(fd);
}

TEST(HttpEndpointTest, AuthenticatedRoutesCheckTheBearerHeaderAndOthersDoNot) {
  HttpEndpointOptions o = Options();
  o.authorize = [](const std::optional<std::string>& h) {
    return h == "Bearer k" ? Status::Ok() : Status(StatusCode::kUnauthenticated, "no token");
  };
  auto ep = StartOrDie(o);
  const std::string body = "Content-Length: 1\r\nConnection: close\r\n\r\nx";
  const std::string refused = Exchange(ep->port(), "POST /echo HTTP/1.1\r\nHost: t\r\n" + body);
  EXPECT_EQ(refused.substr(0, 12), "HTTP/1.1 401") << refused;
  EXPECT_NE(refused.find("WWW-Authenticate: Bearer"), std::string::npos);
  EXPECT_NE(refused.find("{\"error\":\"no token\"}"), std::string::npos);
  const std::string ok = Exchange(ep->port(), "POST /echo HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n" + body);
  EXPECT_EQ(ok.substr(0, 15), "HTTP/1.1 200 OK") << ok;
  EXPECT_EQ(Exchange(ep->port(), std::string(kGetHealth)).substr(0, 15), "HTTP/1.1 200 OK");
}

TEST(HttpEndpointTest, BadOptionsAndABusyPortAreRefused) {
  HttpEndpointOptions o = Options();
  o.threads = 0;
  auto bad = HttpEndpoint::Start(o, Routes());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("threads must be > 0"), std::string::npos);
  auto first = StartOrDie(Options());
  HttpEndpointOptions same = Options();
  same.port = first->port();
  auto second = HttpEndpoint::Start(same, Routes());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

// --- TLS ----------------------------------------------------------------

struct SelfSigned {
  std::string cert_pem, key_pem;
};

std::string Pem(int (*write)(BIO*, void*), void* what) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio, what);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<std::size_t>(n));
  BIO_free(bio);
  return out;
}

SelfSigned MakeSelfSigned() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), 0);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509_sign(x, key, EVP_sha256());
  SelfSigned s;
  s.cert_pem = Pem([](BIO* b, void* p) { return PEM_write_bio_X509(b, static_cast<X509*>(p)); }, x);
  s.key_pem = Pem(
      [](BIO* b, void* p) {
        return PEM_write_bio_PrivateKey(b, static_cast<EVP_PKEY*>(p), nullptr, nullptr, 0, nullptr, nullptr);
      },
      key);
  X509_free(x);
  EVP_PKEY_free(key);
  return s;
}

// A TLS request over a fresh connection; "" when the handshake fails.
std::string TlsExchange(int port, const std::string& request) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  const int fd = Connect(port);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string out;
  if (SSL_connect(ssl) == 1) {
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buf[4096];
    for (int n; (n = SSL_read(ssl, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<std::size_t>(n));
  }
  SSL_free(ssl);
  close(fd);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  return out;
}

TEST(HttpEndpointTest, TlsServesBesideSilentConnectionsAndRefusesPlaintext) {
  const SelfSigned cert = MakeSelfSigned();
  HttpEndpointOptions o = Options();
  o.tls_cert_pem = cert.cert_pem;
  o.tls_key_pem = cert.key_pem;
  o.threads = 1;
  o.header_timeout = std::chrono::minutes(10);
  auto ep = StartOrDie(o);
  ASSERT_TRUE(ep->tls());
  std::vector<int> silent;
  silent.reserve(20);
  for (int i = 0; i < 20; ++i) silent.push_back(Connect(ep->port()));  // no ClientHello
  const std::string r = TlsExchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.substr(0, 15), "HTTP/1.1 200 OK") << r;
  EXPECT_EQ(r.substr(r.size() - 3), "ok\n");
  const std::string plain = Exchange(ep->port(), "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(plain.find("200 OK"), std::string::npos) << plain;
  EXPECT_EQ(ep->Stats().tls_failures, 1u);
  for (int fd : silent) close(fd);
}

TEST(HttpEndpointTest, TlsKeyOfAnotherCertificateIsRefusedAtStart) {
  const SelfSigned a = MakeSelfSigned(), b = MakeSelfSigned();
  HttpEndpointOptions o = Options();
  o.tls_cert_pem = a.cert_pem;
  o.tls_key_pem = b.key_pem;
  auto ep = HttpEndpoint::Start(o, Routes());
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ep.status().message().find("the key does not belong to the certificate"), std::string::npos);
}

}  // namespace
}  // namespace epd
