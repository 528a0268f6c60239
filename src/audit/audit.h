// `atlas audit DIR`: an offline check of one probe run and what was made from it.
//
// It recomputes the SHA-256 of every artifact (manifest -> run -> evaluation -> analysis),
// checks that each names its inputs by the hashes they have now, and re-derives the counts the
// artifacts claim (cells = sources x conditions, route decisions = tokens x gates x k, edits as
// declared, stop counts = ledger totals, every journal line accounted for). Each check is one
// line, PASS / FAIL / SKIP with its numbers; the audit holds only when no check fails.
// docs/audit.md lists the checks and what is not checked.
//
//   AuditReport r = audit_run_dir({.dir = "build/demo/run"});
//   std::fputs(format_audit(r).c_str(), stdout);
//   return r.holds() ? 0 : 3;
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::audit {

struct AuditOptions {
  std::string dir;       // the run directory: DIR/run.json, DIR/journal/, DIR/hidden/
  std::string manifest;  // "" = DIR/manifest.json if present, else the run's recorded manifest input
  std::string eval;      // "" = DIR/EVAL.json if present (then optional); given = required
  std::string analysis;  // "" = DIR/analysis/analysis.json if present; given (file or directory) = required
};

enum class CheckStatus { Pass, Fail, Skip };

struct AuditCheck {
  std::string name;    // "chain evaluation -> run", "cells = sources x conditions", ...
  CheckStatus status = CheckStatus::Pass;
  std::string detail;  // one line: the numbers, or the first thing that does not hold
  ojson numbers = ojson::object();
};

struct AuditedArtifact {
  std::string role;     // manifest | run | evaluation | analysis
  std::string path;     // as found
  std::string how;      // how it was found: "--eval", "DIR/EVAL.json", "run.inputs[0]", ...
  std::string kind;     // as read ("" when unreadable)
  std::string sha256;   // of the file's bytes ("" when missing)
  int64_t bytes = -1;
};

struct AuditReport {
  std::string dir;
  std::vector<AuditedArtifact> artifacts;
  std::vector<AuditCheck> checks;
  int64_t count(CheckStatus s) const;
  bool holds() const { return count(CheckStatus::Fail) == 0; }
};

// Problems with the artifacts are FAIL checks, never exceptions. Throws atlas::Error only when
// there is nothing to audit (DIR is not a directory).
AuditReport audit_run_dir(const AuditOptions& opts);

// What `atlas audit` prints: the artifacts with their SHA-256, then one line per check.
std::string format_audit(const AuditReport& r);

// The report as an artifact ("kind": "atlas.audit"), with provenance; the caller adds runtime.
ojson audit_json(const AuditReport& r);

}  // namespace atlas::audit
