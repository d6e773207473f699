// See epd/media/tenant_key.h. The message is built in one stack buffer: the
// domain and namespace are short (the server caps tenant names at 128 bytes).
#include "epd/media/tenant_key.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>

#include "epd/core/status.h"

namespace epd {
namespace {

void AppendField(std::string& out, std::string_view value) {
  std::uint64_t n = value.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.append(value);
}

}  // namespace

ContentKey NamespacedContentKey(std::span<const std::uint8_t> secret, std::string_view ns, const ContentKey& key) {
  std::string msg;
  msg.reserve(16 + kNamespaceKeyDomain.size() + ns.size() + key.bytes.size());
  AppendField(msg, kNamespaceKeyDomain);
  AppendField(msg, ns);
  msg.append(reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size());
  ContentKey out;
  unsigned int len = 0;
  const unsigned char* made =
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.bytes.data(), &len);
  if (made == nullptr || len != out.bytes.size()) throw Error(Internal("HMAC-SHA256 failed in libcrypto"));
  return out;
}

}  // namespace epd
