// The L3 key file and its keyring (epd/l3/l3_keyring.h).
#include "epd/l3/l3_keyring.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

#include "l3_hex.h"

namespace epd {
namespace {

constexpr std::size_t kMaxFileBytes = std::size_t{64} * 1024;

// One subkey: HMAC-SHA256(secret, label).
StatusOr<L3Secret> Derive(const L3Secret& secret, std::string_view label) {
  HmacSha256 mac(secret);
  mac.Update(label.data(), label.size());
  StatusOr<HmacSha256::Tag> tag = mac.Final();
  if (!tag.ok()) return tag.status();
  L3Secret out;
  std::copy(tag->begin(), tag->end(), out.begin());
  OPENSSL_cleanse(tag->data(), tag->size());
  return out;
}

StatusOr<L3Key> MakeKey(std::uint32_t id, const L3Secret& secret) {
  L3Key k;
  k.id = id;
  StatusOr<L3Secret> v = Derive(secret, "epd-l3 value gmac v1");
  if (!v.ok()) return v.status();
  StatusOr<L3Secret> l = Derive(secret, "epd-l3 lease hmac v1");
  if (!l.ok()) return l.status();
  k.value_key = *v;
  k.lease_key = *l;
  OPENSSL_cleanse(v->data(), v->size());
  OPENSSL_cleanse(l->data(), l->size());
  return k;
}

bool ParseId(std::string_view s, std::uint32_t* out) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v == 0 || v > 0xffffffffu) return false;
  *out = static_cast<std::uint32_t>(v);
  return true;
}

std::vector<std::string_view> Words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

L3Keyring::~L3Keyring() {
  OPENSSL_cleanse(&current_, sizeof(current_));
  if (previous_) OPENSSL_cleanse(&*previous_, sizeof(*previous_));
}

StatusOr<std::shared_ptr<const L3Keyring>> L3Keyring::FromSecrets(
    std::uint32_t current_id, const L3Secret& current, std::optional<std::pair<std::uint32_t, L3Secret>> previous) {
  if (current_id == 0) return InvalidArgument("L3 key id 0 is reserved; use 1..4294967295");
  if (previous && (previous->first == current_id || previous->second == current)) {
    return InvalidArgument("the previous L3 key must have another id and another secret than the current one");
  }
  if (previous && previous->first == 0) return InvalidArgument("L3 key id 0 is reserved; use 1..4294967295");
  std::shared_ptr<L3Keyring> ring(new L3Keyring());
  StatusOr<L3Key> c = MakeKey(current_id, current);
  if (!c.ok()) return c.status();
  ring->current_ = *c;
  if (previous) {
    StatusOr<L3Key> p = MakeKey(previous->first, previous->second);
    if (!p.ok()) return p.status();
    ring->previous_ = *p;
  }
  return std::shared_ptr<const L3Keyring>(std::move(ring));
}

StatusOr<std::shared_ptr<const L3Keyring>> L3Keyring::Parse(std::string_view text, const std::string& source) {
  std::optional<std::pair<std::uint32_t, L3Secret>> current, previous;
  int line_no = 0;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    const std::vector<std::string_view> w = Words(line);
    if (w.empty()) continue;
    auto bad = [&](const std::string& why) {
      // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the line that is rejected.
      return InvalidArgument(source + ":" + std::to_string(line_no) + ": " + why);
    };
    if (w[0] != "current" && w[0] != "previous") {
      return bad("expected 'current <key id> <secret>' or 'previous <key id> <secret>'");
    }
    const std::string role(w[0]);  // "current" or "previous"
    if (w.size() != 3) return bad(role + " takes a key id and a secret, nothing else");
    std::pair<std::uint32_t, L3Secret> key;
    if (!ParseId(w[1], &key.first)) return bad("the key id must be a number in 1..4294967295");
    if (!internal::ParseHex(w[2], key.second.data(), key.second.size()))
      return bad("the secret must be 64 hex digits (32 bytes)");
    auto& slot = w[0] == "current" ? current : previous;
    if (slot) return bad("a second " + role + " line");
    slot = key;
  }
  if (!current) return InvalidArgument(source + ": no 'current <key id> <secret>' line");
  StatusOr<std::shared_ptr<const L3Keyring>> ring = FromSecrets(current->first, current->second, previous);
  OPENSSL_cleanse(&*current, sizeof(*current));
  if (previous) OPENSSL_cleanse(&*previous, sizeof(*previous));
  if (!ring.ok()) return InvalidArgument(source + ": " + ring.status().message());
  return ring;
}

StatusOr<std::shared_ptr<const L3Keyring>> L3Keyring::Load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return InvalidArgument("--l3-key-file " + path + ": cannot be read");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("--l3-key-file " + path + ": not a regular file");
  if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
    return InvalidArgument("--l3-key-file " + path +
                           ": every user of this machine may read or write it; chmod 600 (or 640) it");
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxFileBytes) {
    return InvalidArgument("--l3-key-file " + path + ": over 64 KiB, not a key file");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return InvalidArgument("--l3-key-file " + path + ": cannot be read");
  std::string s = text.str();
  StatusOr<std::shared_ptr<const L3Keyring>> ring = Parse(s, "--l3-key-file " + path);
  OPENSSL_cleanse(s.data(), s.size());
  return ring;
}

const L3Key* L3Keyring::Find(std::uint32_t id) const {
  if (id == current_.id) return &current_;
  if (previous_ && id == previous_->id) return &*previous_;
  return nullptr;
}

std::string L3Keyring::Describe() const {
  std::string out = "key id " + std::to_string(current_.id);
  if (previous_) out += ", previous key id " + std::to_string(previous_->id) + " accepted";
  return out;
}

}  // namespace epd
