// epd-encode: the command-line entry point. Subcommands register themselves
// (tools/commands.h).
#ifdef EPD_WITH_GRPC
#include <absl/synchronization/mutex.h>
#endif
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

#include "commands.h"
#include "epd/core/version.h"

namespace epd::cli {
namespace {

// Control characters other than newline and tab, escaped as \xNN: a message
// quotes names from outside (a file name, a trace's text), and an escape
// sequence in one must not drive the terminal the error is read on.
std::string Printable(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if ((b < 0x20 && c != '\n' && c != '\t') || b == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[b >> 4], kHex[b & 0xf]};
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void FailCommand(int exit_code, const std::string& message) {
  spdlog::error("{}", Printable(message));
  throw CLI::RuntimeError(exit_code);
}

int CommandError(const char* command, const std::string& message) {
  spdlog::error("{}: {}", command, Printable(message));
  return 1;
}

}  // namespace epd::cli

int main(int argc, char** argv) {
#ifdef EPD_WITH_GRPC
  // Debian builds Abseil without NDEBUG, so every absl::Mutex that gRPC
  // takes also updates a global lock-order graph for deadlock detection
  // (absl/synchronization/mutex.h, SetMutexDeadlockDetectionMode). That is a
  // debugging aid, off in release builds of Abseil; it cost a cache hit
  // served through gRPC a measurable share of its CPU here, so the
  // executable turns it off before any thread starts.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  // Logs go to stderr so that stdout carries only results (e.g. --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("epd"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  CLI::App app{"epd-encode: the Encode stage of disaggregated multimodal LLM serving"};
  // `epd-encode --version` prints "epd-encode MAJOR.MINOR.PATCH" (the CMake
  // project's VERSION) and exits 0, without a subcommand.
  app.set_version_flag("--version", "epd-encode " + std::string(epd::kVersion));
  app.require_subcommand(1);
  epd::cli::RegisterReplayCommand(app);
  epd::cli::RegisterPlanCommand(app);
#ifdef EPD_WITH_INSPECT_MODEL
  epd::cli::RegisterInspectModelCommand(app);
#endif
#ifdef EPD_WITH_GRPC
  epd::cli::RegisterServerCommands(app);
  epd::cli::RegisterBenchServerCommand(app);
  epd::cli::RegisterProbeCommand(app);
  epd::cli::RegisterHealthCommand(app);
#endif
  // Exit codes: 0 success (and --help); a subcommand's own code when it
  // fails after parsing (e.g. replay's 3 for failed items); 1 for every
  // usage error, which CLI11 alone would number 105-109 by kind.
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the message (or the help)
    return rc == 0 ? 0 : 1;
  }
  return 0;
}
