// atlas compare A B: field-by-field comparison of two artifacts of one kind (trace, generation),
// outside their runtime sections. Exit 0: identical; 3: they differ; 1: bad input.
#include <cstdio>
#include <filesystem>

#include "audit/compare.h"
#include "cli/command.h"
#include "core/file.h"
#include "core/provenance.h"

namespace atlas::cli {
namespace {

// Differences are not errors: a distinct exit status lets scripts tell them apart.
constexpr int kExitDifferent = 3;

struct CompareArgs {
  std::string a, b, json_out;
  std::vector<std::string> ignore;
  bool strict = false, subset = false;
  int64_t max_diffs = 20;
};

void run_compare(const CompareArgs& args) {
  RuntimeClock clock;
  if (args.max_diffs < 0) fail("--max-diffs", {}, "must be >= 0");
  for (const auto& f : args.ignore)
    if (f.empty()) fail("--ignore", {}, "empty field name");
  const audit::Artifact a = audit::load_artifact(args.a);
  const audit::Artifact b = audit::load_artifact(args.b);
  const audit::CompareOptions opts{.ignore = args.ignore, .strict = args.strict, .subset = args.subset};
  const audit::Comparison c = audit::compare(a, b, opts);
  if (!args.json_out.empty()) {
    // Inputs are recorded relative to the output's directory, so the set can move as a whole.
    const std::string out_dir = std::filesystem::path(args.json_out).parent_path().string();
    ojson j = audit::comparison_json(c, a, b, opts, out_dir.empty() ? "." : out_dir);
    j["runtime"] = runtime_section(clock);
    write_file_atomic(args.json_out, j.dump(2) + "\n");
  }
  std::fputs(audit::format_comparison(c, a, b, args.max_diffs).c_str(), stdout);
  std::fflush(stdout);
  if (!c.identical()) throw CLI::RuntimeError(kExitDifferent);
}

Registrar reg{{
    .name = "compare",
    .help = "Compare two artifacts of one kind field by field (exit 0 identical, 3 different, 1 bad input)",
    .setup =
        [](CLI::App& app) {
          static CompareArgs a;
          app.add_option("A", a.a, "First artifact (trace JSON, or generation JSONL with its .meta.json)")
              ->required();
          app.add_option("B", a.b, "Second artifact, of the same kind")->required();
          app.add_option("--ignore", a.ignore,
                         "Leave out this field and everything under it (dotted path as the differences "
                         "print it, e.g. text, model.config, provenance.git_commit); repeatable")
              ->allow_extra_args(false);  // one field per --ignore: A and B stay positional
          app.add_flag("--strict", a.strict, "Count provenance differences (tool version, commit, build)");
          app.add_flag("--subset", a.subset,
                       "A is a subset rerun of B: cells only in B are reported but do not count");
          app.add_option("--max-diffs", a.max_diffs, "How many differences to list")->capture_default_str();
          app.add_option("--json", a.json_out, "Write the comparison (with input SHA-256s) as JSON");
          app.callback([] { run_compare(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
