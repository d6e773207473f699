// The gRPC family of epd-encode's subcommands (server_commands.h): serve and
// client, each in a source of its own. bench-server registers apart
// (bench_server_command.cc).
#include "server_commands.h"

#include "commands.h"

namespace epd::cli {

void RegisterServerCommands(CLI::App& app) {
  RegisterServeCommand(app);
  RegisterClientCommand(app);
}

}  // namespace epd::cli
