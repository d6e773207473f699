// tools/commands.h: how epd-encode's subcommands plug into its CLI.
//
// tools/main.cc builds one CLI11 app and calls each Register* function below;
// every function adds its own subcommands (with their options and callback)
// and lives in its own file, so a new family of subcommands is one new .cc
// and one line in main.cc, without touching the others.
//
// Contract for a subcommand callback:
//   - print results to stdout and diagnostics to stderr (spdlog's default
//     logger is set to stderr by main.cc, so stdout stays machine-readable);
//   - on failure, print the reason and throw CLI::RuntimeError(exit_code);
//     CLI11 then returns exit_code from main without printing anything more.
//
// Families:
//   RegisterReplayCommand   replay            tools/replay_command.cc
//   RegisterPlanCommand     plan              tools/plan_command.cc
//   RegisterInspectModelCommand  inspect-model  tools/inspect_model_command.cc
//   RegisterServerCommands  serve, client     tools/server_commands.h   } built only
//   RegisterBenchServerCommand  bench-server  tools/bench_server_command.cc } with
//   RegisterProbeCommand    probe             tools/probe_command.cc    } EPD_WITH_GRPC
//   RegisterHealthCommand   health            tools/health_command.cc   }
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace epd::cli {

// The contract above in one place: logs `message` as an error (spdlog, so
// stderr) and throws CLI::RuntimeError(exit_code). Defined in main.cc.
[[noreturn]] void FailCommand(int exit_code, const std::string& message);

// For a subcommand's run function that returns its exit code: logs
// "<command>: <message>" as an error and returns 1. Both escape control
// characters in the message (other than newline and tab) as \xNN.
int CommandError(const char* command, const std::string& message);

void RegisterReplayCommand(CLI::App& app);
void RegisterPlanCommand(CLI::App& app);

#ifdef EPD_WITH_INSPECT_MODEL
void RegisterInspectModelCommand(CLI::App& app);
#endif

#ifdef EPD_WITH_GRPC
void RegisterServerCommands(CLI::App& app);
void RegisterBenchServerCommand(CLI::App& app);
void RegisterProbeCommand(CLI::App& app);
void RegisterHealthCommand(CLI::App& app);
#endif

}  // namespace epd::cli
