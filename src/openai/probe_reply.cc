// See probe_reply.h.
#include "probe_reply.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "front_error.h"

namespace epd::internal {
namespace {

using nlohmann::json;

// "INVALID_ARGUMENT" -> "invalid_argument".
std::string SnakeName(StatusCode code) {
  std::string s(StatusCodeName(code));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

json ItemJson(const StatusOr<ItemProbe>& p, std::size_t index) {
  if (!p.ok()) {
    return {{"index", index},
            {"error",
             {{"message", p.status().message()},
              {"status", HttpStatusOf(p.status().code(), true)},
              {"code", SnakeName(p.status().code())}}}};
  }
  json item = {{"index", index}, {"key", p->key.Hex()}, {"route_key", p->route_key.Hex()}};
  item["grid_thw"] = p->grid.known() ? json::array({p->grid.t, p->grid.h, p->grid.w}) : json::array();
  item["tokens"] = p->tokens;
  return item;
}

}  // namespace

HttpResponse ProbeReply(const StatusOr<std::vector<StatusOr<ItemProbe>>>& probed, const std::string& model,
                        const std::string& server_id) {
  if (!probed.ok()) {
    const bool draining = probed.status().code() == StatusCode::kUnavailable;
    return ErrorResponse(FrontError{HttpStatusOf(probed.status().code(), false), probed.status().message(),
                                    draining ? "draining" : "probe_refused"});
  }
  json data = json::array();
  for (std::size_t i = 0; i < probed->size(); ++i) data.push_back(ItemJson((*probed)[i], i));
  const json body = {{"object", "epd.probe"}, {"model", model}, {"server_id", server_id}, {"data", data}};
  return HttpResponse{200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace)};
}

}  // namespace epd::internal
