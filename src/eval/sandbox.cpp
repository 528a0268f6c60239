#include "eval/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <regex>

#include "core/error.h"
#include "core/json.h"

namespace atlas::eval {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Fixed fd numbers inside bwrap's process (and, for 0-3, inside the program).
constexpr int kReportFd = 3;
constexpr int kStatusFd = 4;
constexpr int kFirstFileFd = 5;

int pidfd_open(pid_t pid) { return int(::syscall(SYS_pidfd_open, pid, 0)); }
int pidfd_kill(int pidfd, int sig) { return int(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0)); }

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd = o.fd;
    o.fd = -1;
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Pipe {
  Fd r, w;
};

Pipe make_pipe() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) fail("sandbox", "pipe", std::strerror(errno));
  return {Fd(p[0]), Fd(p[1])};
}

Fd make_memfd(const std::string& name, const std::string& content) {
  Fd f(int(::memfd_create(name.c_str(), MFD_CLOEXEC)));
  if (f.fd < 0) fail("sandbox", "memfd", std::strerror(errno));
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(f.fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("sandbox", "memfd", std::strerror(errno));
    off += size_t(n);
  }
  ::lseek(f.fd, 0, SEEK_SET);
  return f;
}

// Writes are ignored on a pipe whose reader is gone (a sandbox that closed its stdin) instead
// of killing us with SIGPIPE.
//
// We also become a child subreaper: bwrap's monitor exits as soon as the program's exit code
// is known, while the sandbox's pid 1 is still tearing the pid namespace down. As a subreaper
// we inherit that pid 1 and wait for it, so a run returns only when none of its processes is
// left (and no zombie stays behind).
void process_setup() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::signal(SIGPIPE, SIG_IGN);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  });
}

bool under(const fs::path& p, const fs::path& root) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *q != *r) return false;
  return true;
}

// Reads what is available on fd into out (up to cap bytes kept). Returns false at EOF.
bool drain(int fd, std::string& out, size_t cap, bool& truncated) {
  char buf[8192];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  size_t keep = out.size() < cap ? std::min(size_t(n), cap - out.size()) : 0;
  out.append(buf, keep);
  if (keep < size_t(n)) truncated = true;
  return true;
}

// Slots for concurrent sandboxes of this process: each gets its own host uid.
class UidSlots {
 public:
  int acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < 256; ++i)
      if (!used_[i]) {
        used_[i] = true;
        return i;
      }
    fail("sandbox", "host_uid_base", "more than 256 concurrent sandboxes");
  }
  void release(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    used_[i] = false;
  }

 private:
  std::mutex mu_;
  bool used_[256] = {};
};

UidSlots& uid_slots() {
  static UidSlots s;
  return s;
}

struct SlotGuard {
  int slot = -1;
  ~SlotGuard() {
    if (slot >= 0) uid_slots().release(slot);
  }
};

}  // namespace

std::string resolve_bwrap(const std::string& bwrap) {
  if (bwrap.find('/') != std::string::npos) {
    if (::access(bwrap.c_str(), X_OK) != 0)
      fail(bwrap, {}, "bubblewrap (bwrap) not found or not executable: install the Debian package bubblewrap");
    return bwrap;
  }
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    if (!dir.empty()) {
      std::string cand = dir + "/" + bwrap;
      if (::access(cand.c_str(), X_OK) == 0) return cand;
    }
    start = end + 1;
  }
  fail(bwrap, {}, "bubblewrap (bwrap) not found on PATH: install the Debian package bubblewrap");
}

std::string sandbox_fingerprint(const SandboxConfig& c) {
  const SandboxLimits& l = c.limits;
  ojson j{{"python", c.python},
          {"ro_paths", c.ro_paths},
          {"address_space_bytes", l.address_space_bytes},
          {"processes", l.processes},
          {"cpu_seconds", l.cpu_seconds},
          {"file_size_bytes", l.file_size_bytes},
          {"open_files", l.open_files},
          {"tmpfs_bytes", l.tmpfs_bytes},
          {"wall_seconds", l.wall_seconds}};
  return j.dump();
}

SandboxResult run_sandboxed(const SandboxConfig& config, const SandboxRequest& request) {
  process_setup();
  const SandboxLimits& lim = config.limits;
  if (request.argv.empty()) fail("sandbox", "argv", "empty command");
  if (!(lim.wall_seconds > 0)) fail("sandbox", "wall_seconds", "must be > 0");
  const std::string bwrap = resolve_bwrap(config.bwrap);

  // The program must be visible inside: its real path under one of the read-only paths.
  std::error_code ec;
  const fs::path exe = fs::canonical(config.python, ec);
  if (ec) fail(config.python, "python", "interpreter not found: " + ec.message());
  bool inside = false;
  for (const auto& ro : config.ro_paths) {
    if (ro.empty() || ro[0] != '/') fail("sandbox", "ro_paths", "must be absolute: \"" + ro + "\"");
    if (!fs::exists(ro)) fail(ro, "ro_paths", "does not exist");
    if (under(exe, fs::canonical(ro)) || under(fs::path(config.python).lexically_normal(), ro)) inside = true;
  }
  if (!inside) fail(config.python, "python", "not under any read-only sandbox path (ro_paths)");

  // ---- build bwrap's argument list (before fork: the child only makes system calls) ----
  std::vector<std::string> args = {bwrap,
                                   "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                                   "--unshare-uts", "--unshare-cgroup", "--disable-userns",
                                   "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
                                   "--cap-drop", "ALL", "--die-with-parent", "--new-session",
                                   "--json-status-fd", std::to_string(kStatusFd)};
  for (const auto& ro : config.ro_paths) {
    args.insert(args.end(), {"--ro-bind", ro, ro});
  }
  // Debian's merged /usr: /bin, /lib, /lib64 are symlinks into /usr.
  for (const char* link : {"/bin", "/lib", "/lib64", "/sbin"}) {
    fs::path target = fs::read_symlink(link, ec);
    if (!ec && target.is_relative()) args.insert(args.end(), {"--symlink", target.string(), link});
  }
  args.insert(args.end(), {"--dev", "/dev", "--remount-ro", "/dev", "--perms", "0700", "--size",
                           std::to_string(lim.tmpfs_bytes), "--tmpfs", "/work", "--dir", "/atlas"});
  if (request.files.size() > 32) fail("sandbox", "files", "at most 32 files");
  std::vector<Fd> file_fds;
  for (size_t i = 0; i < request.files.size(); ++i) {
    const auto& f = request.files[i];
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.')
      fail("sandbox", "files", "bad file name \"" + f.name + "\"");
    file_fds.push_back(make_memfd(f.name, f.content));
    args.insert(args.end(), {"--ro-bind-data", std::to_string(kFirstFileFd + int(i)), "/atlas/" + f.name});
  }
  args.insert(args.end(), {"--remount-ro", "/", "--chdir", "/work", "--"});
  args.insert(args.end(), request.argv.begin(), request.argv.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // A fixed, minimal environment: nothing of ours leaks in, and hashing is deterministic.
  std::string env_s[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/work", "PYTHONHASHSEED=0",
                         "PYTHONDONTWRITEBYTECODE=1"};
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  Pipe in = make_pipe(), out = make_pipe(), err = make_pipe(), rep = make_pipe(), st = make_pipe();
  // Child fd layout: 0 stdin, 1 stdout, 2 stderr, 3 report, 4 bwrap status, 5.. files.
  std::vector<int> srcs = {in.r.fd, out.w.fd, err.w.fd, rep.w.fd, st.w.fd};
  for (auto& f : file_fds) srcs.push_back(f.fd);
  const int nfix = int(srcs.size());
  const rlimit rl[] = {
      {lim.address_space_bytes, lim.address_space_bytes},
      {lim.processes, lim.processes},
      {lim.cpu_seconds, lim.cpu_seconds + 1},  // SIGXCPU at the soft limit, SIGKILL one second later
      {lim.file_size_bytes, lim.file_size_bytes},
      {lim.open_files, lim.open_files},
      {0, 0},
  };
  const int rl_res[] = {RLIMIT_AS, RLIMIT_NPROC, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE};

  SlotGuard slot;
  uid_t run_uid = 0;
  const bool switch_uid = ::geteuid() == 0 && config.host_uid_base != 0;
  if (switch_uid) {
    slot.slot = uid_slots().acquire();
    run_uid = uid_t(config.host_uid_base + ((uint32_t(::getpid()) & 0xffffu) << 8) + uint32_t(slot.slot));
    if (run_uid > uid_t(INT32_MAX)) fail("sandbox", "host_uid_base", "too large (bwrap needs ids below 2^31)");
  }

  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) fail("sandbox", "fork", std::strerror(errno));
  if (pid == 0) {
    // Child: async-signal-safe calls only. Move every source fd above the target range first,
    // so that no dup2 overwrites a source still needed.
    int moved[64];
    for (int i = 0; i < nfix && i < 64; ++i) moved[i] = ::fcntl(srcs[i], F_DUPFD, nfix);
    for (int i = 0; i < nfix && i < 64; ++i) {
      if (moved[i] < 0 || ::dup2(moved[i], i) < 0) ::_exit(126);
    }
    for (int i = 0; i < nfix && i < 64; ++i) ::close(moved[i]);
    ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);
    for (size_t i = 0; i < sizeof rl_res / sizeof rl_res[0]; ++i)
      if (::setrlimit(rl_res[i], &rl[i]) != 0) ::_exit(125);
    if (switch_uid && (::setgroups(0, nullptr) != 0 || ::setgid(run_uid) != 0 || ::setuid(run_uid) != 0)) ::_exit(124);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }

  // ---- parent ----
  in.r.reset(); out.w.reset(); err.w.reset(); rep.w.reset(); st.w.reset();
  file_fds.clear();
  Fd bw_pidfd(pidfd_open(pid));
  Fd init_pidfd;  // the sandbox's pid 1, once bwrap has told us its pid
  pid_t init_pid = 0;
  SandboxResult res;
  {
    // The input is small (a nonce): one write, then EOF.
    const std::string& s = request.stdin_data;
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::write(in.w.fd, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      off += size_t(n);
    }
    in.w.reset();
  }
  for (Fd* f : {&out.r, &err.r, &rep.r, &st.r}) ::fcntl(f->fd, F_SETFL, O_NONBLOCK);

  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lim.wall_seconds));
  std::string status;
  bool status_trunc = false;
  bool exited = false, killed = false;
  auto kill_sandbox = [&] {
    // Killing pid 1 of the pid namespace makes the kernel kill every process in it, and bwrap
    // reaps pid 1 only after that: when bwrap exits, nothing of the sandbox is left.
    if (init_pidfd.fd >= 0) pidfd_kill(init_pidfd.fd, SIGKILL);
    else ::kill(pid, SIGKILL);  // bwrap's --die-with-parent takes the sandbox down with it
    killed = true;
  };
  auto grace_deadline = Clock::time_point::max();
  while (!exited) {
    pollfd p[5];
    int np = 0;
    for (Fd* f : {&out.r, &err.r, &rep.r, &st.r})
      if (f->fd >= 0) p[np++] = {f->fd, POLLIN, 0};
    p[np++] = {bw_pidfd.fd, POLLIN, 0};
    const auto now = Clock::now();
    const auto until = killed ? grace_deadline : deadline;
    int ms = until <= now ? 0 : int(std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count()) + 1;
    int rc = ::poll(p, nfds_t(np), ms);
    if (rc < 0 && errno != EINTR) break;
    if (rc == 0 || Clock::now() >= until) {
      if (!killed) {
        res.timed_out = true;
        kill_sandbox();
        grace_deadline = Clock::now() + std::chrono::seconds(5);
      } else {
        ::kill(pid, SIGKILL);  // last resort: bwrap itself
        grace_deadline = Clock::time_point::max();
      }
      continue;
    }
    for (int i = 0; i < np; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int fd = p[i].fd;
      if (fd == bw_pidfd.fd) {
        exited = true;
        continue;
      }
      Fd* f = fd == out.r.fd ? &out.r : fd == err.r.fd ? &err.r : fd == rep.r.fd ? &rep.r : &st.r;
      std::string& dst = f == &out.r ? res.stdout_data : f == &err.r ? res.stderr_data : f == &rep.r ? res.report : status;
      const size_t cap = f == &st.r ? 4096 : request.capture_bytes;
      bool& trunc = f == &st.r ? status_trunc : res.output_truncated;
      if (!drain(fd, dst, cap, trunc)) f->reset();
      if (f == &st.r && init_pidfd.fd < 0) {
        static const std::regex child_re("\"child-pid\"\\s*:\\s*([0-9]+)");
        std::smatch m;
        if (std::regex_search(status, m, child_re)) {
          init_pid = pid_t(std::stol(m[1]));
          init_pidfd = Fd(pidfd_open(init_pid));
          if (res.timed_out) kill_sandbox();
        }
      }
    }
  }
  int wst = 0;
  while (::waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
  }
  while (st.r.fd >= 0 && drain(st.r.fd, status, 4096, status_trunc)) {
    pollfd p{st.r.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
  }
  if (init_pid == 0) {
    static const std::regex child_re("\"child-pid\"\\s*:\\s*([0-9]+)");
    std::smatch m;
    // Seen only now: the pid may already be gone (and, in theory, reused), so no pidfd and no
    // signal; waitpid below only ever touches our own (reparented) child.
    if (std::regex_search(status, m, child_re)) init_pid = pid_t(std::stol(m[1]));
  }
  if (init_pid > 0) {
    // The sandbox's pid 1 is now ours (subreaper). It exits only after the kernel has killed
    // and reaped every other process of its namespace; make sure it is dead, then reap it.
    if (init_pidfd.fd >= 0) {
      pidfd_kill(init_pidfd.fd, SIGKILL);
      pollfd p{init_pidfd.fd, POLLIN, 0};
      while (::poll(&p, 1, 10000) < 0 && errno == EINTR) {
      }
    }
    int ist = 0;
    while (::waitpid(init_pid, &ist, 0) < 0 && errno == EINTR) {
    }
  }
  // Every writer is gone now (the namespace is torn down); collect what is left.
  for (Fd* f : {&out.r, &err.r, &rep.r}) {
    if (f->fd < 0) continue;
    std::string& dst = f == &out.r ? res.stdout_data : f == &err.r ? res.stderr_data : res.report;
    for (int guard = 0; guard < 1024 && drain(f->fd, dst, request.capture_bytes, res.output_truncated); ++guard) {
      pollfd p{f->fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
    }
  }
  res.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  if (WIFEXITED(wst)) {
    const int code = WEXITSTATUS(wst);
    if (code >= 124 && code <= 127 && status.empty() && res.stderr_data.empty()) {
      const char* why = code == 127 ? "could not execute bubblewrap"
                        : code == 126 ? "could not set up file descriptors"
                        : code == 125 ? "could not set the resource limits"
                                      : "could not switch to the unprivileged host uid (host_uid_base)";
      fail(bwrap, {}, std::string(why) + "; untrusted code is never run without the sandbox");
    }
    // bwrap reports a program killed by signal N as exit code 128 + N.
    res.exit_code = code;
    if (code > 128 && code < 128 + 65) res.term_signal = code - 128;
  } else if (WIFSIGNALED(wst)) {
    res.term_signal = WTERMSIG(wst);
  }
  res.started = status.find("child-pid") != std::string::npos;
  {
    static const std::regex ns_re("\"pid-namespace\"\\s*:\\s*([0-9]+)");
    std::smatch m;
    if (std::regex_search(status, m, ns_re)) res.pid_namespace = std::stoull(m[1]);
  }
  // bwrap failing to set up prints "bwrap: ..." and exits 1 before the program ran (and so
  // before it wrote anything on the report channel).
  if (!res.timed_out && res.report.empty() && res.exit_code == 1 && res.stderr_data.rfind("bwrap: ", 0) == 0) {
    std::string msg = res.stderr_data.substr(0, res.stderr_data.find('\n'));
    fail(bwrap, {}, "the sandbox could not be set up (" + msg +
                        "); untrusted code is never run without it");
  }
  return res;
}

void probe_sandbox(const SandboxConfig& config) {
  // Runs inside the sandbox; prints facts as JSON on the report channel.
  static const char* kProbe = R"PY(
import os, json, resource, socket
r = {"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(), "pid": os.getpid()}
r["ifaces"] = [n for _, n in socket.if_nameindex()]
try:
    open("/atlas/probe_write", "w")
    r["root_writable"] = True
except OSError:
    r["root_writable"] = False
open("/work/probe", "w").write("x")
r["work_writable"] = True
r["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
r["as"] = resource.getrlimit(resource.RLIMIT_AS)[0]
r["hostfs"] = sorted(os.listdir("/"))
os.write(3, json.dumps(r).encode())
)PY";
  SandboxConfig c = config;
  c.limits.wall_seconds = std::max(c.limits.wall_seconds, 10.0);
  const SandboxResult res =
      run_sandboxed(c, {.argv = {config.python, "-S", "-s", "-B", "-c", kProbe}, .files = {}, .stdin_data = {}});
  const std::string where = "sandbox probe";
  if (res.timed_out) fail(where, {}, "python did not finish within the wall limit");
  if (res.exit_code != 0 || res.report.empty())
    fail(where, {}, "python failed inside the sandbox (exit " + std::to_string(res.exit_code) +
                        "): " + res.stderr_data.substr(0, 400));
  const json j = parse_json(res.report, where);
  auto expect = [&](bool ok, const char* field, const std::string& what) {
    if (!ok) fail(where, field, what + ", got " + res.report);
  };
  expect(j.at("uid") == 65534 && j.at("gid") == 65534 && j.at("euid") == 65534, "uid", "expected 65534");
  expect(j.at("pid").get<int>() <= 3, "pid", "expected a new pid namespace");
  for (const auto& iface : j.at("ifaces")) expect(iface == "lo", "ifaces", "expected only loopback");
  expect(!j.at("root_writable").get<bool>(), "root_writable", "expected a read-only root");
  expect(j.at("nproc").get<uint64_t>() == config.limits.processes, "nproc", "RLIMIT_NPROC not applied");
  expect(j.at("as").get<uint64_t>() == config.limits.address_space_bytes, "as", "RLIMIT_AS not applied");
}

}  // namespace atlas::eval
