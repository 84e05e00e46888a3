// moeserve: serve and study DeepSeek-V3/R1-class MoE models. See README.md.
#include <cstdio>
#include <vector>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace moeserve::cli;
  CLI::App app{"moeserve: DeepSeek-V3/R1-class MoE inference (MLA, FP8, EP, EPLB)"};
  app.require_subcommand(1);
  std::vector<Subcommand> commands = {
      add_make_model_command(app), add_generate_command(app),    add_sim_command(app),
      add_eplb_command(app),       add_serve_command(app),       add_tokenize_command(app),
      add_detokenize_command(app), add_render_chat_command(app), add_perplexity_command(app),
      add_router_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every usage error exits 2 (CLI11's own codes vary).
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;
}
