// The `moeserve` subcommands. Each add_*_command registers its options on the parent app and
// returns the function that runs it (its exit code: 0 ok, 1 runtime error, 2 usage error).
// One file per subcommand: cmd_<name>.cpp.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace moeserve::cli {

struct Subcommand {
  CLI::App* app;
  std::function<int()> run;
};

Subcommand add_make_model_command(CLI::App& parent);
Subcommand add_generate_command(CLI::App& parent);
Subcommand add_sim_command(CLI::App& parent);
Subcommand add_eplb_command(CLI::App& parent);
Subcommand add_serve_command(CLI::App& parent);
Subcommand add_tokenize_command(CLI::App& parent);
Subcommand add_detokenize_command(CLI::App& parent);
Subcommand add_render_chat_command(CLI::App& parent);

}  // namespace moeserve::cli
