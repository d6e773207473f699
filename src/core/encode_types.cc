// ItemSourceName (epd/core/encode_types.h).
#include "epd/core/encode_types.h"

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

}  // namespace epd
