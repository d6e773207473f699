// The ring of independent Redis servers (src/l3/redis_router.h): one Shard
// per --l3 URL, a key's shard chosen by consistent hashing
// (epd/l3/l3_ring.h). Nothing is redirected: a shard that fails is a miss
// for its keys until it is back.
#include "redis_router.h"

#include <algorithm>

#include "epd/l3/l3_ring.h"

namespace epd::internal {
namespace {

class RingRouter final : public Router {
 public:
  RingRouter(std::vector<RedisUrl> urls, const RedisTierOptions& o) {
    std::vector<std::string> names;
    for (RedisUrl& u : urls) {
      names.push_back(u.Name());
      shards_.push_back(std::make_unique<Shard>(std::move(u), o));
    }
    ring_ = std::make_unique<HashRing>(std::move(names), o.virtual_nodes);
  }

  CommandResult Run(const ContentKey& key, std::string_view /*redis_key*/,
                    const std::vector<std::string_view>& argv) override {
    return shards_[ring_->ShardFor(key)]->Run(argv);
  }
  bool degraded() const override {
    return std::any_of(shards_.begin(), shards_.end(), [](const auto& s) { return s->down(); });
  }
  void AddStats(SharedTierStats& /*s*/) const override {}
  std::string Describe() const override {
    std::string out;
    for (const std::string& n : ring_->names()) out += (out.empty() ? "redis://" : ",redis://") + n;
    return out;
  }

 private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<HashRing> ring_;
};

}  // namespace

std::unique_ptr<Router> MakeRingRouter(std::vector<RedisUrl> urls, const RedisTierOptions& o) {
  return std::make_unique<RingRouter>(std::move(urls), o);
}

}  // namespace epd::internal
