// What the worker loop found for a request's items in the shared tier (L3),
// handed to the worker beside the request, never inside it: only the loop
// can offer a value for adoption (EncodeWorker's public Submit cannot).
#pragma once

#include <utility>
#include <vector>

#include "epd/core/embedding.h"
#include "epd/worker/encode_worker.h"

namespace epd::internal {

// A shared-tier value for one item's key, and the encode cost the tier
// stored with it (seconds; -1 = EntryCost::kUnmeasured). Null value = none.
// When L1/L2 hold nothing for the key, the worker checks the value against
// the item's expected grid, tokens, width, dtype and deepstack layers like
// any hit and, if it matches, caches it and delivers it as ItemSource::kL3;
// otherwise refuses it (WorkerStats::adopt_rejections, TakeRefused) and
// encodes the item.
struct AdoptedValue {
  EmbeddingPtr value;
  double seconds = -1;
};

// The loop's entry point into EncodeWorker (a friend of it): Submit with
// `adopted` either empty or one entry per item of `request`.
class LoopSubmit {
 public:
  static Status Submit(EncodeWorker& worker, EncodeRequest request, RequestCallbacks callbacks,
                       std::vector<StatusOr<ContentKey>> keys, std::vector<AdoptedValue> adopted) {
    return worker.SubmitAdopting(std::move(request), std::move(callbacks), std::move(keys), std::move(adopted));
  }
};

}  // namespace epd::internal
