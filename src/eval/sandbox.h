// A sandbox for untrusted model code: one bubblewrap (bwrap) container per run, plus kernel
// resource limits, with the wall clock enforced here in the parent.
//
// What a run gets (docs/eval.md has the threat model):
//   - new user, pid, network, ipc, uts and cgroup namespaces; no network at all (a private
//     loopback only), no further user namespaces inside;
//   - uid/gid 65534 (nobody) inside, every capability dropped, no-new-privs (bwrap sets it),
//     its own session (no TIOCSTI into our terminal), killed when its parent dies;
//   - a read-only view of only the listed host paths (default /usr, which holds Debian's
//     python3), a read-only /dev with the standard nodes, a read-only root, the caller's files
//     read-only under /atlas, and a private, size-limited tmpfs /work as working dir;
//   - rlimits set before bwrap is executed and inherited by everything inside: address space,
//     processes, CPU seconds, file size, open files, no core dumps; when we are root, bwrap
//     itself runs as an unused unprivileged host uid (see host_uid_base);
//   - a wall-clock deadline: the sandbox's pid-1 is SIGKILLed, which makes the kernel kill every
//     process of its pid namespace before we see it reaped, so nothing outlives a run.
// There is never an unsandboxed fallback: if bwrap is missing or cannot create its namespaces,
// run_sandboxed() throws atlas::Error with bwrap's own message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atlas::eval {

struct SandboxLimits {
  uint64_t address_space_bytes = 256ull << 20;  // RLIMIT_AS
  uint64_t processes = 64;                      // RLIMIT_NPROC (per sandbox: see docs/eval.md)
  uint64_t cpu_seconds = 10;                    // RLIMIT_CPU, per process (SIGXCPU, then SIGKILL)
  uint64_t file_size_bytes = 16ull << 20;       // RLIMIT_FSIZE (SIGXFSZ / EFBIG)
  uint64_t open_files = 256;                    // RLIMIT_NOFILE
  uint64_t tmpfs_bytes = 16ull << 20;           // size of the /work tmpfs
  double wall_seconds = 5.0;                    // enforced by the parent
};

struct SandboxConfig {
  std::string bwrap = "bwrap";               // looked up on PATH when it has no '/'
  std::string python = "/usr/bin/python3";   // must lie under one of ro_paths
  std::vector<std::string> ro_paths = {"/usr"};  // host paths visible read-only, same place
  SandboxLimits limits;
  // When we are root, bwrap runs as an otherwise unused host uid/gid, base + (our pid mod 65536)
  // * 256 + a slot per concurrent sandbox, instead of root: the sandbox's uid 65534 then maps
  // to that uid, not to host root, and RLIMIT_NPROC (which the kernel never enforces for a
  // task whose real uid is host root) counts exactly this sandbox's processes. 0 keeps our uid.
  // Below 2^31: bwrap rejects larger ids.
  uint32_t host_uid_base = 2000000000;
};

// One file placed read-only at /atlas/<name> inside the sandbox.
struct SandboxFile {
  std::string name;
  std::string content;
};

struct SandboxRequest {
  std::vector<std::string> argv;     // argv[0] is run inside the sandbox (e.g. the python path)
  std::vector<SandboxFile> files;
  std::string stdin_data;            // written to the program's stdin, which is then closed
  size_t capture_bytes = 64 << 10;   // kept from stdout / stderr / the report channel each
};

struct SandboxResult {
  bool started = false;      // the sandboxed program was executed (bwrap set everything up)
  bool timed_out = false;    // the wall deadline fired and the sandbox was killed
  int exit_code = -1;        // of the sandboxed program, when it exited normally
  int term_signal = 0;       // of the sandboxed program, when a signal ended it
  std::string stdout_data, stderr_data;
  std::string report;        // what the program wrote on fd 3 (the report channel)
  bool output_truncated = false;
  double wall_seconds = 0;   // runtime fact only
  uint64_t pid_namespace = 0;  // inode of the sandbox's pid namespace (bwrap's status), 0 if unknown
};

// Runs one request in a fresh sandbox. Throws atlas::Error when the sandbox cannot be set up
// (bwrap missing, namespaces refused, python not inside the view); a program that misbehaves
// is not an error, its outcome is in the result.
SandboxResult run_sandboxed(const SandboxConfig& config, const SandboxRequest& request);

// Checks once that the configured sandbox works and really is one: runs python inside and
// verifies uid/gid 65534, pid namespace, no capabilities, no network interfaces besides
// loopback, a read-only root and the rlimits. Throws atlas::Error naming what is wrong.
void probe_sandbox(const SandboxConfig& config);

// A stable description of the config (limits, paths) for cache keys and artifacts.
std::string sandbox_fingerprint(const SandboxConfig& config);

// Resolves the bwrap path (PATH lookup); throws atlas::Error when it is not installed.
std::string resolve_bwrap(const std::string& bwrap);

}  // namespace atlas::eval
