// atlas audit DIR: recompute every artifact's SHA-256, check the chain manifest -> run ->
// evaluation -> analysis and re-derive the run's counts (docs/audit.md).
// Exit 0: every check holds; 3: a check fails; 1: bad input (DIR is not a directory, a bad flag).
#include <cstdio>

#include "audit/audit.h"
#include "cli/command.h"
#include "core/file.h"
#include "core/provenance.h"

namespace atlas::cli {
namespace {

constexpr int kExitFails = 3;  // as compare's "different": a finding, not a usage error

struct AuditArgs {
  std::string dir, manifest, eval, analysis, json_out;
};

void run_audit(const AuditArgs& a) {
  RuntimeClock clock;
  const audit::AuditReport r =
      audit::audit_run_dir({.dir = a.dir, .manifest = a.manifest, .eval = a.eval, .analysis = a.analysis});
  if (!a.json_out.empty()) {
    ojson j = audit::audit_json(r);
    j["runtime"] = runtime_section(clock);
    write_file_atomic(a.json_out, j.dump(1) + "\n");
  }
  std::fputs(audit::format_audit(r).c_str(), stdout);
  std::fflush(stdout);
  if (!r.holds()) throw CLI::RuntimeError(kExitFails);
}

Registrar reg{{
    .name = "audit",
    .help = "Check a probe run directory offline: artifact hashes, the hash chain, re-derived counts (exit 0 all hold, 3 a check fails)",
    .setup =
        [](CLI::App& app) {
          static AuditArgs a;
          app.add_option("DIR", a.dir, "Run directory of `atlas run` (DIR/run.json, DIR/journal/)")->required();
          app.add_option("--manifest", a.manifest,
                         "The frozen manifest (default: DIR/manifest.json, else the manifest run.json records)");
          app.add_option("--eval", a.eval, "EVAL.json of `atlas eval` (default: DIR/EVAL.json when present)");
          app.add_option("--analysis", a.analysis,
                         "Output directory (or analysis.json) of `atlas analyze` (default: DIR/analysis/ when present)");
          app.add_option("--json", a.json_out, "Also write the report as JSON (atomically)");
          app.footer(
              "Prints the artifacts found (with SHA-256) and one PASS / FAIL / SKIP line per check: each\n"
              "artifact's own hash, each chain link (an artifact names its inputs' SHA-256), and the\n"
              "invariants (cells = sources x conditions, edits as declared, route decisions = tokens x\n"
              "gates x k, stop states, hidden vectors, journal lines, ledger totals, analysis counts).\n"
              "An artifact named by a flag must exist. See docs/audit.md.");
          app.callback([] { run_audit(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
