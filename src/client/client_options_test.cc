// ClientOptions::Validate: each rule refuses with kInvalidArgument and a
// message naming the option; a minimal good set passes.
#include <gtest/gtest.h>

#include <string>

#include "epd/client/client.h"

namespace epd {
namespace {

ClientOptions Good() {
  ClientOptions o;
  o.target = "127.0.0.1:50051";
  return o;
}

void ExpectRefused(const ClientOptions& o, const std::string& says) {
  const Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << says;
  EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
}

TEST(ClientOptionsValidateTest, ATargetIsEnough) { EXPECT_TRUE(Good().Validate().ok()); }

TEST(ClientOptionsValidateTest, EachBadOptionIsNamed) {
  ClientOptions o = Good();
  o.target.clear();
  ExpectRefused(o, "client target is empty");
  o = Good();
  o.timeout = std::chrono::milliseconds(0);
  ExpectRefused(o, "client timeout must be > 0 ms, got 0");
  o = Good();
  o.max_response_bytes = 0;
  ExpectRefused(o, "max_response_bytes must be in (0, 2047 MiB], got 0");
  o.max_response_bytes = std::int64_t{2048} << 20;
  ExpectRefused(o, "max_response_bytes must be in (0, 2047 MiB], got 2147483648");
  o = Good();
  o.delivery = Delivery::kCudaIpc;
  ExpectRefused(o, "Delivery::kCudaIpc needs ClientOptions::ipc_device");
  o = Good();
  o.tls_client_cert_pem = "-----BEGIN CERTIFICATE-----";
  ExpectRefused(o, "tls_client_key_pem is missing");
  o = Good();
  o.tls_client_key_pem = "-----BEGIN PRIVATE KEY-----";
  ExpectRefused(o, "tls_client_cert_pem is missing");
}

TEST(ClientOptionsValidateTest, ConnectRefusesWhatValidateRefuses) {
  ClientOptions o = Good();
  o.timeout = std::chrono::milliseconds(-1);
  StatusOr<std::unique_ptr<EncodeClient>> c = EncodeClient::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), o.Validate().message());
}

}  // namespace
}  // namespace epd
