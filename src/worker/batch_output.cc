// Batch output checks and slicing. The copy out of host output is the one
// copy of an item's rows on the way into the cache: the cache never aliases
// a buffer the tower may reuse for its next batch.
#include "batch_output.h"

#include <exception>
#include <memory>
#include <string>

namespace epd::internal {

Status CheckOutput(const StatusOr<TowerOutput>& out, std::int64_t items, std::int64_t tokens, const VisionTower& tower,
                   bool can_adopt) {
  if (!out.ok()) return Internal("vision tower failed: " + out.status().message());
  const TowerOutput& o = *out;
  const std::size_t dsize = DTypeSize(o.dtype);
  if (o.tokens != tokens) {
    return Internal("vision tower returned " + std::to_string(o.tokens) + " rows for a batch of " +
                    std::to_string(items) + " items totalling " + std::to_string(tokens) + " tokens");
  }
  if (o.shape() != tower.OutputShape(o.tokens)) {
    return Internal("vision tower output is hidden " + std::to_string(o.hidden) + ", deepstack " +
                    std::to_string(o.deepstack_layers) + ", " + std::string(DTypeName(o.dtype)) +
                    "; the tower declares hidden " + std::to_string(tower.hidden()) + ", deepstack " +
                    std::to_string(tower.deepstack_layers()) + ", " + std::string(DTypeName(tower.dtype())));
  }
  if (o.on_device()) {
    // Sizes are the backend's to keep; only the pointers can be checked.
    if ((o.main_bytes() > 0 && o.device_main == nullptr) ||
        (o.deepstack_bytes() > 0 && o.device_deepstack == nullptr)) {
      return Internal("vision tower output is on the device but its " +
                      std::string(o.device_main == nullptr ? "main" : "deepstack") + " pointer is null");
    }
    if (!can_adopt) {
      return Internal("vision tower output is on the device, but the worker has no adopt_device_rows hook");
    }
    return Status::Ok();
  }
  if (o.main.size() != o.main_bytes() || o.deepstack.size() != o.deepstack_bytes()) {
    return Internal("vision tower output holds " + std::to_string(o.main.size()) + "+" +
                    std::to_string(o.deepstack.size()) + " bytes, its shape [" + std::to_string(o.tokens) + ", " +
                    std::to_string(o.hidden) + "] x (1 + " + std::to_string(o.deepstack_layers) + ") needs " +
                    std::to_string(o.tokens * o.hidden * (1 + o.deepstack_layers) * dsize));
  }
  return Status::Ok();
}

StatusOr<EmbeddingPtr> AdoptRows(const AdoptDeviceRowsFn& adopt, const DeviceRows& rows) {
  StatusOr<EmbeddingPtr> adopted = EmbeddingPtr();
  try {
    adopted = adopt(rows);
  } catch (const std::exception& ex) {
    return Internal(std::string("adopt_device_rows threw: ") + ex.what());
  } catch (...) {
    return Internal("adopt_device_rows threw a non-standard exception");
  }
  if (!adopted.ok()) return adopted;
  if (*adopted == nullptr) return Internal("adopt_device_rows returned no embedding");
  const Embedding& got = **adopted;
  if (got.shape() != rows.shape() || got.nbytes() != got.ExpectedBytes()) {
    return Internal("adopt_device_rows returned an embedding of " + std::to_string(got.tokens) + " tokens x " +
                    std::to_string(got.hidden) + " x (1 + " + std::to_string(got.deepstack_layers) + ") " +
                    std::string(DTypeName(got.dtype)) + " (" + std::to_string(got.nbytes()) + " bytes) for rows of " +
                    std::to_string(rows.tokens) + " x " + std::to_string(rows.hidden) + " x (1 + " +
                    std::to_string(rows.deepstack_layers) + ") " + std::string(DTypeName(rows.dtype)));
  }
  if (got.grid != rows.grid) {
    return Internal("adopt_device_rows returned an embedding of grid " + got.grid.ToString() + " for rows of grid " +
                    rows.grid.ToString());
  }
  return adopted;
}

StatusOr<EmbeddingPtr> BatchOutputReader::Next(const GridTHW& grid, std::int64_t tokens) {
  // This item's rows of the batch output: [main_off_, +main_bytes) and
  // [deep_off_, +deep_bytes), wherever the output lives.
  const TowerOutput& o = out_;
  const EmbeddingShape item{tokens, o.hidden, o.deepstack_layers, o.dtype};
  const std::size_t main_bytes = item.main_bytes();
  const std::size_t deep_bytes = item.deepstack_bytes();
  const std::size_t main_off = main_off_, deep_off = deep_off_;
  main_off_ += main_bytes;
  deep_off_ += deep_bytes;
  if (o.on_device()) {
    // The GPU tier copies them device -> device into an L1 entry; the batch
    // output stays alive until that copy lands.
    DeviceRows rows;
    static_cast<EmbeddingShape&>(rows) = item;
    rows.grid = grid;
    rows.main = o.device_main + main_off;
    rows.deepstack = o.device_deepstack == nullptr ? nullptr : o.device_deepstack + deep_off;
    rows.owner = o.device_owner;
    return AdoptRows(adopt_, rows);
  }
  auto m = std::make_shared<Embedding>();
  static_cast<EmbeddingShape&>(*m) = item;
  m->grid = grid;
  m->main.assign(o.main.data() + main_off, o.main.data() + main_off + main_bytes);
  m->deepstack.assign(o.deepstack.data() + deep_off, o.deepstack.data() + deep_off + deep_bytes);
  return EmbeddingPtr(std::move(m));
}

}  // namespace epd::internal
