// libFuzzer entry point for the replay trace parser (tools/trace.h): JSON
// Lines from a file the user names, so any bytes. Beyond "no crash, no
// sanitizer report" it checks, and aborts if one breaks:
//   - every failure is kInvalidArgument and names a line ("fuzz:<n>: ...");
//   - a parsed trace, written back with TraceToJsonLines, parses again to
//     the same requests (ids, arrival times, image lists);
//   - every parsed request has a non-empty id, arrival_ms >= 0 and at least
//     one image.
// The same function is linked into trace_corpus_replay (any compiler).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trace.h"

namespace {

[[noreturn]] void Violated(const char* what, const epd::Status& s) {
  std::fprintf(stderr, "trace_fuzzer: invariant violated: %s (%s)\n", what, s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto trace = epd::cli::ParseTrace(text, "fuzz");
  if (!trace.ok()) {
    if (trace.status().code() != epd::StatusCode::kInvalidArgument) {
      Violated("ParseTrace failed with a code other than INVALID_ARGUMENT", trace.status());
    }
    if (trace.status().message().rfind("fuzz:", 0) != 0) Violated("error does not name the line", trace.status());
    return 0;
  }
  for (const epd::cli::TraceRequest& r : *trace) {
    if (r.id.empty() || !(r.arrival_ms >= 0) || r.images.empty()) {
      Violated("a parsed request breaks the format's rules", epd::Status::Ok());
    }
  }
  auto again = epd::cli::ParseTrace(epd::cli::TraceToJsonLines(*trace), "again");
  if (!again.ok()) Violated("TraceToJsonLines output does not parse", again.status());
  if (again->size() != trace->size()) Violated("round trip changed the number of requests", epd::Status::Ok());
  for (std::size_t i = 0; i < trace->size(); ++i) {
    const auto& a = (*trace)[i];
    const auto& b = (*again)[i];
    if (a.id != b.id || a.arrival_ms != b.arrival_ms || a.images != b.images) {
      Violated("round trip changed a request", epd::Status::Ok());
    }
  }
  return 0;
}
