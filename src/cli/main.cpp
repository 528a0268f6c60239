// atlas: the thin command-line front end. Each verb lives in its own cmd_*.cpp.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "atlas/build_info.h"
#include "cli/command.h"
#include "core/error.h"

namespace atlas::cli {

std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

bool progress_enabled() {
  if (const char* v = std::getenv("ATLAS_PROGRESS")) return std::string(v) == "1";
  return ::isatty(2);
}

}  // namespace atlas::cli

int main(int argc, char** argv) {
  using namespace atlas::cli;
  CLI::App app{"atlas: an instrumented DeepSeek-V2 MoE engine and experiment harness"};
  app.set_version_flag("--version", std::string("atlas ") + ATLAS_VERSION + " (" + ATLAS_GIT_COMMIT + ", " +
                                        ATLAS_BUILD_TYPE + ")");
  app.require_subcommand(1);
  auto cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(*app.add_subcommand(c.name, c.help));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version; CLI::RuntimeError is a verb's own verdict exit (audit, compare: 3)
    if (e.get_exit_code() == 0 || dynamic_cast<const CLI::RuntimeError*>(&e)) return app.exit(e);
    // A bad flag is bad input like any other: one line, exit 1 (CLI11's own message is two
    // lines and exits 1xx), naming the verb whose flags --help lists.
    std::string verb;
    for (const CLI::App* sub : app.get_subcommands()) verb = " " + sub->get_name();
    if (verb.empty()) {  // no verb parsed: a misspelt one reads better than "a subcommand is required"
      const std::string first = argc > 1 ? argv[1] : "";
      const std::string what = first.empty()    ? std::string(e.what())
                               : first[0] == '-' ? "unknown option \"" + first + "\" before the verb"
                                                 : "unknown verb \"" + first + "\"";
      std::fprintf(stderr, "atlas: error: %s (atlas --help lists the verbs)\n", what.c_str());
      return 1;
    }
    std::fprintf(stderr, "atlas%s: error: %s (atlas%s --help lists the flags)\n", verb.c_str(), e.what(), verb.c_str());
    return 1;
  } catch (const atlas::Error& e) {
    std::fprintf(stderr, "atlas: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be used (--out naming a file where a directory goes, ...).
    // what() is "filesystem error: OPERATION: REASON [PATH]": keep OPERATION: REASON after the path.
    std::string what = e.what();
    if (const size_t p = what.find(" ["); p != std::string::npos) what.resize(p);
    if (what.rfind("filesystem error: ", 0) == 0) what.erase(0, 18);
    std::fprintf(stderr, "atlas: error: %s: %s\n", e.path1().c_str(), what.c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "atlas: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
