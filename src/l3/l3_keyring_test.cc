// The L3 key file (epd/l3/l3_keyring.h): current and previous keys by id,
// subkeys equal to HMAC-SHA256(secret, label) computed here with OpenSSL's
// one-shot HMAC(), every malformed file refused naming its line without
// quoting a secret, and a file every user may read refused.
#include "epd/l3/l3_keyring.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace epd {
namespace {

const std::string kSecretA = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const std::string kSecretB = "F0E1D2C3B4A5968778695A4B3C2D1E0FF0E1D2C3B4A5968778695A4B3C2D1E0F";

L3Secret Subkey(const std::string& hex, const char* label) {
  unsigned char secret[32];
  for (std::size_t i = 0; i < 32; ++i)
    secret[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  L3Secret out;
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret, 32, reinterpret_cast<const unsigned char*>(label), std::strlen(label), out.data(), &n);
  EXPECT_EQ(n, 32u);
  return out;
}

TEST(L3Keyring, ParsesCurrentAndPreviousWithComments) {
  const std::string text = "# cluster key, rotated 2026-11\n\ncurrent 12 " + kSecretA +
                           "   # the new one\r\n\tprevious  11\t" + kSecretB + "\n";
  StatusOr<std::shared_ptr<const L3Keyring>> r = L3Keyring::Parse(text, "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const L3Keyring& ring = **r;
  EXPECT_EQ(ring.current().id, 12u);
  EXPECT_TRUE(ring.has_previous());
  EXPECT_EQ(ring.Find(12), &ring.current());
  ASSERT_NE(ring.Find(11), nullptr);
  EXPECT_EQ(ring.Find(11)->id, 11u);
  EXPECT_EQ(ring.Find(13), nullptr);
  EXPECT_EQ(ring.current().value_key, Subkey(kSecretA, "epd-l3 value gmac v1"));
  EXPECT_EQ(ring.current().lease_key, Subkey(kSecretA, "epd-l3 lease hmac v1"));
  EXPECT_EQ(ring.Find(11)->value_key, Subkey(kSecretB, "epd-l3 value gmac v1"));
  EXPECT_NE(ring.current().value_key, ring.current().lease_key);
  EXPECT_EQ(ring.Describe(), "key id 12, previous key id 11 accepted");
}

TEST(L3Keyring, MalformedFilesAreRefusedNamingTheLineNotTheSecret) {
  struct Case {
    std::string text, why;
  };
  const Case cases[] = {
      {"", "no 'current <key id> <secret>' line"},
      {"previous 1 " + kSecretA + "\n", "no 'current"},
      {"current 1 " + kSecretA + "\ncurrent 2 " + kSecretB + "\n", "test:2: a second current line"},
      {"current 0 " + kSecretA, "test:1: the key id must be a number in 1..4294967295"},
      {"current 4294967296 " + kSecretA, "the key id must be"},
      {"current -3 " + kSecretA, "the key id must be"},
      {"current 1 " + kSecretA.substr(2), "test:1: the secret must be 64 hex digits"},
      {"current 1 " + kSecretA.substr(0, 63) + "g", "64 hex digits"},
      {"current 1 " + kSecretA + " extra", "current takes a key id and a secret, nothing else"},
      {"\n\nnext 1 " + kSecretA, "test:3: expected 'current"},
      {"current 1 " + kSecretA + "\nprevious 1 " + kSecretB, "another id and another secret"},
      {"current 1 " + kSecretA + "\nprevious 2 " + kSecretA, "another id and another secret"},
  };
  for (const Case& c : cases) {
    StatusOr<std::shared_ptr<const L3Keyring>> r = L3Keyring::Parse(c.text, "test");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find(kSecretA.substr(0, 20)), std::string::npos) << r.status().message();
  }
}

TEST(L3Keyring, LoadRefusesAWorldReadableFileAndReadsAPrivateOne) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("epd-keyring-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "l3.key").string();
  std::ofstream(path) << "current 5 " << kSecretA << "\n";
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  StatusOr<std::shared_ptr<const L3Keyring>> open = L3Keyring::Load(path);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status().message();
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  StatusOr<std::shared_ptr<const L3Keyring>> ok = L3Keyring::Load(path);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->current().id, 5u);
  EXPECT_FALSE((*ok)->has_previous());
  StatusOr<std::shared_ptr<const L3Keyring>> missing = L3Keyring::Load((dir / "none").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  StatusOr<std::shared_ptr<const L3Keyring>> folder = L3Keyring::Load(dir.string());
  EXPECT_NE(folder.status().message().find("not a regular file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace epd
