// ContentKey's hex form, both ways.
#include "epd/core/content_key_type.h"

namespace epd {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string ContentKey::Hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(bytes.size() * 2, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

StatusOr<ContentKey> ParseContentKeyHex(std::string_view hex) {
  ContentKey key;
  if (hex.size() != key.bytes.size() * 2) {
    return InvalidArgument("content key hex has " + std::to_string(hex.size()) + " characters, expected 64");
  }
  for (std::size_t i = 0; i < key.bytes.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      const std::size_t at = hi < 0 ? 2 * i : 2 * i + 1;
      return InvalidArgument("content key hex has a non-hex character at position " + std::to_string(at));
    }
    key.bytes[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return key;
}

}  // namespace epd
