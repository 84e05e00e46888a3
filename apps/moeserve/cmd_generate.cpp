#include "commands.h"

namespace moeserve::cli {

Subcommand add_generate_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("generate", "not yet built");
  return {app, [] { return 1; }};
}

}  // namespace moeserve::cli
