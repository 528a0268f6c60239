// CLI verbs register themselves: each src/cli/cmd_*.cpp holds one verb and a static
// Registrar, so adding a verb never touches main.cpp.
//
//   static atlas::cli::Registrar reg{{
//       .name = "inspect", .help = "Summarise and verify a checkpoint",
//       .setup = [](CLI::App& app) { ...add options...; app.callback([] { ... }); }}};
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace atlas::cli {

struct Command {
  std::string name;
  std::string help;
  std::function<void(CLI::App&)> setup;
};

std::vector<Command>& registry();

struct Registrar {
  explicit Registrar(Command c) { registry().push_back(std::move(c)); }
};

// Progress lines go to stderr only when it is a terminal (or ATLAS_PROGRESS=1).
bool progress_enabled();

}  // namespace atlas::cli
