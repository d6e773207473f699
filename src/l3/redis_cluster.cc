// Redis Cluster for the shared tier (src/l3/redis_cluster.h).
//
// Design notes.
// - The map is a plain array of 16384 pool pointers: a lookup is one index
//   under a mutex, and a refresh builds a whole new array off the lock and
//   swaps it in, so no command ever waits on a network call of another.
// - A MOVED answer is the cluster's word for one slot, newer than any map:
//   after reading the whole map again (rate-limited), the redirected slot is
//   pointed at the node MOVED named, whatever that read said.
// - ASK is for one command only (the slot is being migrated): the map is
//   left alone, and the retry goes to the named node with ASKING first on
//   the same connection.
// - A node that fails is not retried here: its Shard is marked down with a
//   backoff, the map is read again from the others, and the command goes to
//   the slot's new master only when the map changed (after a replica's
//   promotion); otherwise it fails at once and the tier serves a miss.
//   Benefits: a failover costs each request at most one timeout. Costs:
//   until the cluster promotes the replica (cluster-node-timeout plus an
//   election), that master's slots are misses, and their writes are dropped.
#include "redis_cluster.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <thread>

namespace epd::internal {
namespace {

bool ParseInt(std::string_view s, int lo, int hi, int* out) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string HostPort(const std::string& host, int port) { return host + ":" + std::to_string(port); }

}  // namespace

std::uint16_t Crc16(std::string_view bytes) {
  std::uint16_t crc = 0;
  for (const char ch : bytes) {
    crc ^= static_cast<std::uint16_t>(static_cast<unsigned char>(ch) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc =
          (crc & 0x8000) != 0 ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : static_cast<std::uint16_t>(crc << 1);
    }
  }
  return crc;
}

std::string_view HashTag(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const std::size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

int KeySlot(std::string_view key) { return Crc16(HashTag(key)) % kClusterSlots; }

std::optional<Redirect> ParseRedirect(std::string_view error) {
  Redirect r;
  if (StartsWith(error, "MOVED ")) {
    error.remove_prefix(6);
  } else if (StartsWith(error, "ASK ")) {
    r.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const std::size_t space = error.find(' ');
  if (space == std::string_view::npos || !ParseInt(error.substr(0, space), 0, kClusterSlots - 1, &r.slot)) {
    return std::nullopt;
  }
  const std::string_view address = error.substr(space + 1);
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || !ParseInt(address.substr(colon + 1), 1, 65535, &r.port)) return std::nullopt;
  r.host = std::string(address.substr(0, colon));
  return r;
}

StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply* reply, std::string_view asked_host) {
  auto bad = [](const std::string& why) { return InvalidArgument("CLUSTER SLOTS reply: " + why); };
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) return bad("not an array");
  std::vector<SlotRange> out;
  for (std::size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) return bad("entry " + std::to_string(i) + " is too short");
    const redisReply* master = e->element[2];
    if (e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        master->type != REDIS_REPLY_ARRAY || master->elements < 2 || master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      return bad("entry " + std::to_string(i) + " is not [first, last, [host, port, ...], ...]");
    }
    SlotRange r;
    r.first = static_cast<int>(e->element[0]->integer);
    r.last = static_cast<int>(e->element[1]->integer);
    r.port = static_cast<int>(master->element[1]->integer);
    r.host = std::string(master->element[0]->str, master->element[0]->len);
    if (r.host.empty() || r.host == "?") r.host = std::string(asked_host);
    if (r.first < 0 || r.last >= kClusterSlots || r.first > r.last || r.port < 1 || r.port > 65535) {
      return bad("entry " + std::to_string(i) + " has slots " + std::to_string(r.first) + ".." +
                 std::to_string(r.last) + " or port " + std::to_string(r.port) + " out of range");
    }
    out.push_back(std::move(r));
  }
  return out;
}

StatusOr<std::vector<RedisUrl>> ParseClusterUrl(std::string_view url) {
  constexpr std::string_view kScheme = "redis-cluster://";
  if (!StartsWith(url, kScheme)) return InvalidArgument("--l3 URL: a cluster URL must start with redis-cluster://");
  std::string_view rest = url.substr(kScheme.size());
  std::string credentials;
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    credentials = std::string(rest.substr(0, at + 1));
    rest = rest.substr(at + 1);
  }
  std::vector<RedisUrl> seeds;
  std::set<std::string> seen;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const std::string shown = "redis-cluster://" + std::string(item);
    if (item.empty()) return InvalidArgument("--l3 URL: empty seed in a redis-cluster:// list");
    StatusOr<RedisUrl> seed = ParseRedisUrl("redis://" + credentials + std::string(item));
    if (!seed.ok()) return InvalidArgument("--l3 seed '" + shown + "': " + seed.status().message());
    if (seed->db != 0) return InvalidArgument("--l3 seed '" + shown + "': Redis Cluster has database 0 only");
    if (!seen.insert(HostPort(seed->host, seed->port)).second) {
      return InvalidArgument("--l3 lists the seed " + HostPort(seed->host, seed->port) + " twice");
    }
    seeds.push_back(*std::move(seed));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return seeds;
}

ClusterRouter::ClusterRouter(std::vector<RedisUrl> seeds, const RedisTierOptions& o)
    : opt_(o), seeds_(std::move(seeds)) {}

Shard& ClusterRouter::Node(const std::string& host, int port) {
  MutexLock lock(mu_);
  std::unique_ptr<Shard>& node = nodes_[HostPort(host, port)];
  if (node == nullptr) {
    RedisUrl u = seeds_.front();  // the credentials
    u.host = host;
    u.port = port;
    u.db = 0;
    node = std::make_unique<Shard>(std::move(u), opt_);
  }
  return *node;
}

Shard* ClusterRouter::NodeFor(int slot) {
  {
    MutexLock lock(mu_);
    if (slots_[slot] != nullptr) return slots_[slot];
  }
  Refresh();
  MutexLock lock(mu_);
  return slots_[slot];
}

void ClusterRouter::PointSlot(int slot, Shard* node) {
  MutexLock lock(mu_);
  slots_[slot] = node;
}

bool ClusterRouter::Refresh() {
  MutexLock refresh(refresh_mu_);
  const Clock::time_point now = Clock::now();
  if (last_refresh_ != Clock::time_point() && now - last_refresh_ < kRefreshGap) return false;
  last_refresh_ = now;
  // The seeds first (the operator's word), then every node met since.
  std::vector<Shard*> order;
  for (const RedisUrl& s : seeds_) order.push_back(&Node(s.host, s.port));
  {
    MutexLock lock(mu_);
    for (auto& [name, node] : nodes_) {
      if (std::find(order.begin(), order.end(), node.get()) == order.end()) order.push_back(node.get());
    }
  }
  std::stable_partition(order.begin(), order.end(), [](Shard* s) { return !s->down(); });
  for (Shard* node : order) {
    if (RefreshFrom(*node)) return true;
  }
  return false;
}

bool ClusterRouter::RefreshFrom(Shard& node) {
  CommandResult r = node.Run({"CLUSTER", "SLOTS"});
  if (!r.error_kind.empty()) return false;
  const std::string asked_host = node.name().substr(0, node.name().rfind(':'));
  StatusOr<std::vector<SlotRange>> ranges = ParseClusterSlots(r.reply.get(), asked_host);
  if (!ranges.ok() || ranges->empty()) return false;
  std::array<Shard*, kClusterSlots> fresh{};
  for (const SlotRange& range : *ranges) {
    Shard* owner = &Node(range.host, range.port);
    for (int slot = range.first; slot <= range.last; ++slot) fresh[slot] = owner;
  }
  MutexLock lock(mu_);
  slots_ = fresh;
  mapped_ = true;
  ++refreshes_;
  return true;
}

CommandResult ClusterRouter::Run(const ContentKey& /*key*/, std::string_view redis_key,
                                 const std::vector<std::string_view>& argv) {
  const int slot = KeySlot(redis_key);
  Shard* target = NodeFor(slot);
  bool asking = false;
  std::chrono::milliseconds backoff{1};
  CommandResult r;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    if (target == nullptr) break;
    r = target->Run(argv, asking);
    asking = false;
    if (r.error_kind.empty()) return r;
    if (r.reply == nullptr) {  // the node failed: has its replica taken over?
      Refresh();
      Shard* now = NodeFor(slot);
      if (now == nullptr || now == target) return r;
      target = now;
      continue;
    }
    const std::string_view message(r.reply->str, r.reply->len);
    if (std::optional<Redirect> to = ParseRedirect(message)) {
      const std::string host = to->host.empty() ? target->name().substr(0, target->name().rfind(':')) : to->host;
      Shard& next = Node(host, to->port);
      if (to->ask) {
        ++ask_;
        asking = true;
      } else {
        ++moved_;
        Refresh();
        PointSlot(to->slot, &next);
      }
      target = &next;
      continue;
    }
    if (!StartsWith(message, "TRYAGAIN") && !StartsWith(message, "CLUSTERDOWN")) return r;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, opt_.timeout);
    if (StartsWith(message, "CLUSTERDOWN")) {
      Refresh();
      target = NodeFor(slot);
    }
  }
  if (target == nullptr) {
    r = CommandResult();
    r.error_kind = "down";
    r.error = "Redis Cluster: no node known for slot " + std::to_string(slot) + " (no seed answered CLUSTER SLOTS)";
    r.node = "cluster";
  }
  return r;
}

bool ClusterRouter::degraded() const {
  std::set<Shard*> serving;
  {
    MutexLock lock(mu_);
    if (!mapped_) return true;
    for (Shard* s : slots_) {
      if (s == nullptr) return true;
      serving.insert(s);
    }
  }
  return std::any_of(serving.begin(), serving.end(), [](Shard* s) { return s->down(); });
}

void ClusterRouter::AddStats(SharedTierStats& s) const {
  s.redirects_moved += moved_.load();
  s.redirects_ask += ask_.load();
  s.slot_map_refreshes += refreshes_.load();
}

std::string ClusterRouter::Describe() const {
  std::string out = "redis-cluster://";
  for (std::size_t i = 0; i < seeds_.size(); ++i) {
    out += (i > 0 ? "," : "") + HostPort(seeds_[i].host, seeds_[i].port);
  }
  return out;
}

std::string ClusterRouter::NodeOfSlot(int slot) const {
  MutexLock lock(mu_);
  return slots_[slot] != nullptr ? slots_[slot]->name() : std::string();
}

}  // namespace epd::internal
