// `epd-encode inspect-model DIR`: what a Hugging Face checkpoint directory
// will run as. Opens it as --model would (epd/model/checkpoint.h: config,
// preprocessor config, vision tensors validated, model id hashed) and prints
// the architecture, the vision tower's parameters, its output width and
// deepstack layers, the preprocessing and the model id that goes into the
// content keys. Reads no language-model weights and needs no torch.
//
// Exit codes: 0 described; 1 the directory is not a loadable checkpoint (the
// reason goes to stderr).
#include <iostream>
#include <string>

#include "commands.h"
#include "epd/model/checkpoint.h"

namespace epd::cli {

void RegisterInspectModelCommand(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect-model", "describe a Hugging Face checkpoint directory's vision tower");
  cmd->add_option("dir", *dir, "checkpoint directory (config.json, preprocessor_config.json, *.safetensors)")
      ->required();
  cmd->callback([dir] {
    StatusOr<std::shared_ptr<const Checkpoint>> ck = OpenCheckpoint(*dir);
    if (!ck.ok()) {
      std::cerr << "inspect-model: " << ck.status().ToString() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << DescribeCheckpoint(**ck);
  });
}

}  // namespace epd::cli
