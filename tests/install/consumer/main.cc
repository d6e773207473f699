// Prints the installed epd's version and a Status made by the installed
// library (StatusCodeName and Status::ToString are compiled into
// libepd_core.a), one per line.
#include <cstdio>
#include <string>

#include "epd/core/status.h"
#include "epd/core/version.h"

int main() {
  const epd::Status st = epd::ResourceExhausted("pinned pool full");
  std::printf("%s\n%s\n", std::string(epd::kVersion).c_str(), st.ToString().c_str());
  return st.code() == epd::StatusCode::kResourceExhausted ? 0 : 1;
}
