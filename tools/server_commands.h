// tools/server_commands.h: the gRPC family of epd-encode's subcommands, one
// source each. RegisterServerCommands (commands.h, server_commands.cc) calls
// every Register* below; a new subcommand of the family is one new .cc, its
// line here and its call there.
//
// Thread safety: call from main's thread, before parsing (as commands.h).
#pragma once

#include <CLI/CLI.hpp>

namespace epd::cli {

void RegisterServeCommand(CLI::App& app);   // serve   tools/serve_command.cc
void RegisterClientCommand(CLI::App& app);  // client  tools/client_command.cc

}  // namespace epd::cli
