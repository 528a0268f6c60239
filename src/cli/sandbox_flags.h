// The HumanEval sandbox flags, shared by `atlas humaneval` and `atlas eval` so both verbs take
// the same options with the same defaults (those of eval::SandboxLimits).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "eval/humaneval.h"

namespace atlas::cli {

struct SandboxFlags {
  std::string cache, python = "/usr/bin/python3", bwrap = "bwrap";
  std::vector<std::string> ro_paths;
  int workers = 0;
  double timeout = 5.0;
  uint32_t host_uid_base = 2000000000;
  uint64_t memory_mib = 256, processes = 64, cpu_seconds = 10, file_size_mib = 16, tmpfs_mib = 16;
};

void add_sandbox_flags(CLI::App& app, SandboxFlags& f);
// Validated evaluator options from the flags (cache left unset: the caller owns it).
eval::EvalOptions sandbox_options(const SandboxFlags& f);

}  // namespace atlas::cli
