// ItemSourceName and RequestResult::all_ok (epd/core/encode_types.h).
#include "epd/core/encode_types.h"

#include <algorithm>

namespace epd {

std::string_view ItemSourceName(ItemSource source) {
  switch (source) {
    case ItemSource::kL1:
      return "l1";
    case ItemSource::kL2:
      return "l2";
    case ItemSource::kMiss:
      return "miss";
    case ItemSource::kJoined:
      return "joined";
    case ItemSource::kL3:
      return "l3";
  }
  return "unknown";
}

bool RequestResult::all_ok() const {
  if (!status.ok()) return false;
  return std::all_of(items.begin(), items.end(), [](const ItemResult& r) { return r.status.ok(); });
}

}  // namespace epd
