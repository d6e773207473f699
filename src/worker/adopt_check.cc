// CheckAdoptedValue (adopt_check.h). The checks run cheapest first, and the
// first failure is the one named, so a log line says what differs.
#include "adopt_check.h"

#include <string>

namespace epd::internal {
namespace {

Status Refused(const std::string& what) {
  return Status(StatusCode::kDataLoss, "the shared tier's value " + what + "; refused and re-encoded");
}

Status Differs(const char* field, std::int64_t got, std::int64_t want, const char* source) {
  return Refused("has " + std::string(field) + " " + std::to_string(got) + ", " + source + " " + std::to_string(want));
}

}  // namespace

Status CheckAdoptedValue(const Embedding& e, const AdoptExpectation& want, const VisionTower& tower,
                         std::int64_t merge_size) {
  const GridTHW& g = e.grid;
  if (want.grid.has_value() && g != *want.grid) {
    return Refused("has grid " + g.ToString() + ", the image's header gives " + want.grid->ToString());
  }
  if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.patches() != e.tokens * merge_size * merge_size) {
    return Refused("has grid " + g.ToString() + ", which does not give its " + std::to_string(e.tokens) +
                   " tokens at merge size " + std::to_string(merge_size));
  }
  if (want.tokens != 0 && e.tokens != want.tokens) return Differs("tokens", e.tokens, want.tokens, "the item needs");
  const EmbeddingShape s = tower.OutputShape(e.tokens);
  if (e.hidden != s.hidden) return Differs("hidden size", e.hidden, s.hidden, "this tower's is");
  if (e.dtype != s.dtype) {
    return Refused("has dtype " + std::string(DTypeName(e.dtype)) + ", this tower's is " +
                   std::string(DTypeName(s.dtype)));
  }
  if (e.deepstack_layers != s.deepstack_layers) {
    return Differs("deepstack layers", e.deepstack_layers, s.deepstack_layers, "this tower has");
  }
  if (e.nbytes() != e.ExpectedBytes()) {
    return Refused("holds " + std::to_string(e.nbytes()) + " bytes, its shape needs " +
                   std::to_string(e.ExpectedBytes()));
  }
  if (e.on_host() && !RowsFinite(e)) return Refused("holds non-finite rows (NaN or Inf)");
  return Status::Ok();
}

}  // namespace epd::internal
