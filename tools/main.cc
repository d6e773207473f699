// epd-encode: the command-line entry point. Subcommands register themselves
// (tools/commands.h).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "commands.h"

int main(int argc, char** argv) {
  // Logs go to stderr so that stdout carries only results (e.g. --json).
  spdlog::set_default_logger(spdlog::stderr_color_mt("epd"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  CLI::App app{"epd-encode: the Encode stage of disaggregated multimodal LLM serving"};
  app.require_subcommand(1);
  epd::cli::RegisterReplayCommand(app);
#ifdef EPD_WITH_GRPC
  epd::cli::RegisterServerCommands(app);
#endif
  CLI11_PARSE(app, argc, argv);
  return 0;
}
