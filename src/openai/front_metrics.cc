// See front_metrics.h.
#include "front_metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <sstream>
#include <utility>
#include <vector>

namespace epd::internal {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// One family of unlabelled or singly labelled samples.
MetricFamily Series(const std::string& name, const std::string& help, MetricType type, const std::string& label,
                    const std::vector<std::pair<std::string, double>>& samples) {
  MetricFamily f{name, help, type, {}};
  for (const auto& [value_label, v] : samples) {
    ClientMetric m;
    if (!label.empty()) m.label.push_back({label, value_label});
    (type == MetricType::Counter ? m.counter.value : m.gauge.value) = v;
    f.metric.push_back(std::move(m));
  }
  return f;
}

MetricFamily One(const std::string& name, const std::string& help, MetricType type, double v) {
  return Series(name, help, type, "", {{"", v}});
}

}  // namespace

void FrontMetrics::CountFetch(const std::string& outcome) {
  MutexLock lock(mu_);
  ++fetches_[outcome];
}

std::string FrontMetrics::Render(const EcPublisherStats* ec, const HttpEndpointStats& http) const {
  std::vector<std::pair<std::string, double>> by_status, by_outcome;
  for (const auto& [status, n] : http.responses) by_status.emplace_back(std::to_string(status), static_cast<double>(n));
  {
    MutexLock lock(mu_);
    for (const auto& [outcome, n] : fetches_) by_outcome.emplace_back(outcome, static_cast<double>(n));
  }
  std::vector<MetricFamily> out;
  out.push_back(Series("epd_http_responses_total",
                       "OpenAI front responses, by HTTP status (every status its endpoint sent, its own "
                       "404/405/408/413/414/431 included)",
                       MetricType::Counter, "status", by_status));
  out.push_back(Series("epd_http_media_fetches_total", "Media URLs resolved by the OpenAI front, by outcome",
                       MetricType::Counter, "outcome", by_outcome));
  out.push_back(One("epd_http_parked_connections", "OpenAI front connections waiting for a request (no thread held)",
                    MetricType::Gauge, static_cast<double>(http.parked)));
  const std::pair<const char*, std::uint64_t> edge[] = {{"epd_http_header_timeouts_total", http.header_timeouts},
                                                        {"epd_http_body_timeouts_total", http.body_timeouts},
                                                        {"epd_http_bodies_too_large_total", http.bodies_too_large},
                                                        {"epd_http_handler_exceptions_total", http.handler_exceptions},
                                                        {"epd_http_clients_gone_total", http.clients_gone}};
  for (const auto& [name, v] : edge) {
    out.push_back(
        One(name, "OpenAI front connections (docs/SERVER.md, HTTP edge)", MetricType::Counter, static_cast<double>(v)));
  }
  if (ec != nullptr) {
    const std::pair<const char*, std::uint64_t> counters[] = {
        {"epd_ec_files_published_total", ec->published},     {"epd_ec_files_present_total", ec->already_present},
        {"epd_ec_files_evicted_total", ec->evicted},         {"epd_ec_evicted_bytes_total", ec->evicted_bytes},
        {"epd_ec_write_failures_total", ec->write_failures}, {"epd_ec_over_budget_total", ec->over_budget}};
    for (const auto& [name, v] : counters) {
      out.push_back(One(name, "ECExampleConnector files in --ec-dir (docs/VLLM.md)", MetricType::Counter,
                        static_cast<double>(v)));
    }
    out.push_back(One("epd_ec_dir_files", "Files this server knows in --ec-dir", MetricType::Gauge,
                      static_cast<double>(ec->files)));
    out.push_back(One("epd_ec_dir_bytes", "Bytes of those files", MetricType::Gauge, static_cast<double>(ec->bytes)));
  }
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, out);
  return os.str();
}

}  // namespace epd::internal
