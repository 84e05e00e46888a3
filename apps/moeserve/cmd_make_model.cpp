#include "commands.h"

namespace moeserve::cli {

Subcommand add_make_model_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("make-model", "not yet built");
  return {app, [] { return 1; }};
}

}  // namespace moeserve::cli
