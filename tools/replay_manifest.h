// tools/replay_manifest.h: the manifest `epd-encode replay --out` writes
// beside its safetensors file, so a user can find the embedding of each image
// of each request (docs/REPLAY.md, "Manifest").
//
// JSON Lines, one line per (request, item), in trace order then item order:
//   {"request": "r1", "item": 0, "media": "a.jpg", "key": "<64 hex>",
//    "grid_thw": [1, 30, 46], "tokens": 345, "bytes": 2473440,
//    "cost_s": 0.0123, "source": "miss", "file": "emb.safetensors"}
//   request   the trace's request id
//   item      the image's index in the request
//   media     the image path as the trace names it
//   key       the content key; the embedding is the tensor of that name in
//             `file` ("<key>.deepstack" and "<key>.grid_thw" beside it,
//             epd/worker/safetensors.h). Equal images share one key and one tensor.
//   grid_thw  the patch grid (t, h, w) prefill needs; absent when unknown
//   tokens    rows of the tensor
//   bytes     the embedding's bytes (main plus deepstack), its cache charge
//   cost_s    seconds: the measured encode cost of the image (ItemResult::
//             encode_seconds of the item the tower ran for this key, or of
//             the item adopted from L3 with the cost stored there; on a hit
//             or a join of it too); absent when no item of the replay
//             carries one (the tower's item failed, or the L3 value had no
//             cost)
//   source    "l1", "l2", "l3", "miss" or "joined" (epd::ItemSourceName)
//   file      the safetensors path as given to --out
// A failed item has "error" (e.g. "INVALID_ARGUMENT: item 0: ...") instead of
// grid_thw, tokens, bytes, cost_s, source and file, and "key" only when its
// key was derived. So the manifest is a cache trace (tools/cache_trace.h):
// `epd-encode plan --trace emb.manifest.jsonl` sizes the tiers with the
// replay's measured costs (it skips the "error" lines).
// Fields appear in the order above; the text is a pure function of the
// arguments.
//
// Thread safety: pure functions; thread-safe.
#pragma once

#include <span>
#include <string>
#include <unordered_map>

#include "epd/core/status.h"
#include "epd/worker/encode_worker.h"
#include "trace.h"

namespace epd::cli {

// Each key's measured encode cost in `results`: the first finite, >= 0
// ItemResult::encode_seconds of an item that succeeded with that key (the
// item the tower ran for it, or the one adopted from L3 with its stored
// cost). The manifest's cost_s, and replay --mrc's costs.
std::unordered_map<ContentKey, double, ContentKeyHash> MeasuredCosts(std::span<const RequestResult> results);

// The manifest text. REQUIRES: results[i] is the result of trace[i] (same
// size; items by index).
std::string ReplayManifestJsonLines(std::span<const TraceRequest> trace, std::span<const RequestResult> results,
                                    const std::string& out_file);

// Where the manifest of `out_file` goes: "emb.safetensors" ->
// "emb.manifest.jsonl"; a name without that extension gets
// ".manifest.jsonl" appended.
std::string ManifestPathFor(const std::string& out_file);

// Writes ReplayManifestJsonLines to `path`; kUnavailable when it cannot.
Status WriteReplayManifest(const std::string& path, std::span<const TraceRequest> trace,
                           std::span<const RequestResult> results, const std::string& out_file);

}  // namespace epd::cli
