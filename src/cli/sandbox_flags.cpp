#include "cli/sandbox_flags.h"

#include <cstdint>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace atlas::cli {

void add_sandbox_flags(CLI::App& app, SandboxFlags& f) {
  app.add_option("--workers", f.workers, "Parallel sandboxes (0: the machine's cores)")->capture_default_str();
  app.add_option("--cache", f.cache, "Directory of cached results (kept across runs; timeouts are not cached)");
  app.add_option("--timeout", f.timeout, "Wall-clock limit per candidate, seconds")->capture_default_str();
  app.add_option("--memory-mib", f.memory_mib, "Address-space limit (RLIMIT_AS), MiB")->capture_default_str();
  app.add_option("--processes", f.processes, "Process limit per sandbox (RLIMIT_NPROC)")->capture_default_str();
  app.add_option("--cpu-seconds", f.cpu_seconds, "CPU-time limit per process (RLIMIT_CPU)")->capture_default_str();
  app.add_option("--file-size-mib", f.file_size_mib, "File-size limit (RLIMIT_FSIZE), MiB")->capture_default_str();
  app.add_option("--tmpfs-mib", f.tmpfs_mib, "Size of the private /work tmpfs, MiB")->capture_default_str();
  app.add_option("--python", f.python, "Python interpreter used inside the sandbox")->capture_default_str();
  app.add_option("--ro-path", f.ro_paths, "Host path visible read-only inside (repeatable; default /usr)");
  app.add_option("--bwrap", f.bwrap, "bubblewrap executable")->capture_default_str();
  app.add_option("--host-uid-base", f.host_uid_base,
                 "When root: run each sandbox as host uid BASE+k (0: as root; RLIMIT_NPROC is then not enforced)")
      ->capture_default_str();
}

eval::EvalOptions sandbox_options(const SandboxFlags& f) {
  if (!(f.timeout > 0)) fail({}, "--timeout", "must be > 0");
  if (f.workers < 0) fail({}, "--workers", "must be >= 0 (0: the machine's cores)");
  // A zero limit makes every sandbox fail with bubblewrap's or the kernel's words, not the flag's;
  // the MiB counts are bounded so that their bytes (<< 20) cannot wrap.
  const auto limit = [](const char* flag, uint64_t v, uint64_t most) {
    if (v < 1 || v > most) fail({}, flag, "must be from 1 to " + std::to_string(most) + ", got " + std::to_string(v));
  };
  limit("--memory-mib", f.memory_mib, uint64_t(1) << 30);
  limit("--file-size-mib", f.file_size_mib, uint64_t(1) << 30);
  limit("--tmpfs-mib", f.tmpfs_mib, uint64_t(1) << 30);
  limit("--processes", f.processes, uint64_t(1) << 22);
  limit("--cpu-seconds", f.cpu_seconds, uint64_t(1) << 31);
  eval::EvalOptions opt;
  opt.sandbox.python = f.python;
  opt.sandbox.bwrap = f.bwrap;
  opt.sandbox.host_uid_base = f.host_uid_base;
  if (!f.ro_paths.empty()) opt.sandbox.ro_paths = f.ro_paths;
  opt.sandbox.limits = {.address_space_bytes = f.memory_mib << 20,
                        .processes = f.processes,
                        .cpu_seconds = f.cpu_seconds,
                        .file_size_bytes = f.file_size_mib << 20,
                        .open_files = 256,
                        .tmpfs_bytes = f.tmpfs_mib << 20,
                        .wall_seconds = f.timeout};
  opt.workers = f.workers;
  opt.progress = progress_enabled();
  return opt;
}

}  // namespace atlas::cli
