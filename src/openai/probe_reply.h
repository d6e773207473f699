// src/openai/probe_reply.h (internal): the reply of POST /v1/probe, the
// HTTP face of the Probe RPC (docs/SERVER.md, "Probe"). The request is a
// chat request (src/openai/chat_request.h); its media resolve under the
// same URL rules and budget, then ServerFrontDoor::Probe reads their
// headers. 200 with one entry per item, in order:
//   {"object": "epd.probe", "model": M, "server_id": S,
//    "data": [{"index": 0, "key": "<64 hex>", "route_key": "<64 hex>",
//              "grid_thw": [t, h, w], "tokens": n}, ...]}
// An item that cannot be probed is {"index": i, "error": {"message": m,
// "status": <the HTTP status its encode would fail with>, "code":
// "invalid_argument" | "failed_precondition" | ...}}; the others are still
// given. A refusal of the whole probe (shutting down) is the front's error
// page.
#pragma once

#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/http/http_endpoint.h"
#include "epd/worker/item_probe.h"

namespace epd::internal {

HttpResponse ProbeReply(const StatusOr<std::vector<StatusOr<ItemProbe>>>& probed, const std::string& model,
                        const std::string& server_id);

}  // namespace epd::internal
