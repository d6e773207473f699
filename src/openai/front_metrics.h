// src/openai/front_metrics.h (internal): the OpenAI front's counters and
// their Prometheus text (appended to the server's /metrics page, see
// epd/openai/openai_front.h for the names). Built with prometheus-cpp's
// TextSerializer.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "epd/core/mutex.h"
#include "epd/http/http_endpoint.h"
#include "epd/openai/ec_publisher.h"

namespace epd::internal {

class FrontMetrics {
 public:
  // "ok", "refused", "too_large", "failed", "bad_url".
  void CountFetch(const std::string& outcome);
  // `ec`: null when nothing is published. epd_http_responses_total comes
  // from the endpoint's own count (`http.responses`).
  std::string Render(const EcPublisherStats* ec, const HttpEndpointStats& http) const;

 private:
  mutable Mutex mu_;
  std::map<std::string, std::uint64_t> fetches_ EPD_GUARDED_BY(mu_);
};

}  // namespace epd::internal
