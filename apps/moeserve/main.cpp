// moeserve: serve and study DeepSeek-V3/R1-class MoE models. See README.md.
#include <cstdio>
#include <vector>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace moeserve::cli;
  CLI::App app{"moeserve: DeepSeek-V3/R1-class MoE inference (MLA, FP8, EP, EPLB)"};
  app.require_subcommand(1);
  std::vector<Subcommand> commands = {
      add_make_model_command(app),
      add_generate_command(app),
      add_sim_command(app),
      add_eplb_command(app),
      add_tokenize_command(app),
      add_detokenize_command(app),
      add_render_chat_command(app),
  };
  CLI11_PARSE(app, argc, argv);
  for (auto& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;
}
