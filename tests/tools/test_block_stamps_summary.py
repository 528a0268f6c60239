"""tools/profile/block_stamps_summary.py on a synthetic ATLAS_BLOCK_STAMPS file whose answers are
known: two decode steps of one MoE window each (a dense lean launch of 2 blocks beside a grouped
lean launch of 3 blocks, on 2 SMs), then the roles, the per-SM bytes and busy times, the most
blocks resident on one SM, the timeline, and bad input (a wrong header, a short line, times out of
order: one error naming the file and line, exit 1), the co-residency of a launch's blocks, and the
orders of residency of two racing launches.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
TOOL = os.path.join(SRC, "tools", "profile", "block_stamps_summary.py")
HEAD = "t0_ns,go_ns,t1_ns,site,n,k,grid,block,smid,kind,bytes"


def run(path, *args, ok=True):
    r = subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"FAIL: {args}: rc {r.returncode}: {r.stderr}")
    if not ok and r.returncode != 1:
        sys.exit(f"FAIL: {args}: expected rc 1, got {r.returncode}: {r.stdout}")
    return r


def step(t):  # one window starting at t ns
    us = 1000
    return [
        # dense lean (kind 0), site a0, 2 blocks of 512 KB on SMs 0 and 1, running 0-10 us
        (t, t, t + 10 * us, "a0", 5632, 2048, 2, 0, 0, 0, 512 * 1024),
        (t, t, t + 10 * us, "a0", 5632, 2048, 2, 1, 1, 0, 512 * 1024),
        # grouped lean (kind 16), site b0, 3 blocks of 256 KB: resident at 1 us, running from 2 us
        (t + us, t + 2 * us, t + 6 * us, "b0", 2816, 2048, 3, 0, 0, 16, 256 * 1024),
        (t + us, t + 2 * us, t + 6 * us, "b0", 2816, 2048, 3, 1, 1, 16, 256 * 1024),
        (t + us, t + 2 * us, t + 12 * us, "b0", 2816, 2048, 3, 2, 0, 16, 256 * 1024),
    ]


with tempfile.TemporaryDirectory() as d:
    good = os.path.join(d, "s.csv")
    with open(good, "w") as f:
        f.write(HEAD + "\n")
        for t in (1_000_000, 3_000_000):  # two steps 2 ms apart
            for r in step(t):
                f.write(",".join(str(x) for x in r) + "\n")
    out = run(good, "--timeline").stdout
    lines = out.splitlines()
    if lines[0] != "10 blocks, 4 launches in 2 windows":
        sys.exit(f"FAIL: header {lines[0]!r}")
    dense = next(x for x in lines if x.startswith("lean    5632x2048  dense"))
    grouped = next(x for x in lines if x.startswith("lean    2816x2048  grouped"))
    # dense: 2 launches, 2 blocks, wait 0, run 10 us, 512 KB, 52.43 GB/s (524288 B / 10000 ns), start 0, end 10
    if dense.split()[3:] != ["2", "2", "0.00", "10.00", "512.0", "52.43", "0.00", "10.00"]:
        sys.exit(f"FAIL: dense role {dense!r}")
    # grouped: wait 1 us, runs 4, 4, 10 (median 4), 256 KB, rates 65.5, 65.5, 26.2 (median 65.54), start 1, end 12
    if grouped.split()[3:] != ["2", "3", "1.00", "4.00", "256.0", "65.54", "1.00", "12.00"]:
        sys.exit(f"FAIL: grouped role {grouped!r}")
    # Per window: span 12 us, 1,792 KB (1.84 MB), 2 SMs; SM 0: 512 + 256 + 256 KB, busy 0-12 us; SM 1: 768 KB, busy 0-10;
    # SM 0 holds 3 blocks at once (1-6 us).
    comp = next(i for i, x in enumerate(lines) if x.startswith("2 windows of:"))
    want = ("   span 12.00 us, 1.84 MB, 2 SMs; per SM: 768/896/1024 KB, busy 10.00/11.00/12.00 us; "
            "at most 3 blocks resident on one SM")
    if lines[comp + 1] != want:
        sys.exit(f"FAIL: window {lines[comp + 1]!r}")
    # Timeline: at 0.5 us 2 resident / 2 running; at 1.5 us 5 / 2; at 2.5 us 5 / 5; at 7.5 us 3 / 3; at 11.5 us 1 / 1.
    tl = {}
    for x in lines[comp + 3:]:
        if not x.strip() or not x.split()[0].isdigit():
            break
        tl[int(x.split()[0])] = x.split()[1:]
    for us, want in {0: ["2", "2"], 1: ["5", "2"], 2: ["5", "5"], 7: ["3", "3"], 11: ["1", "1"]}.items():
        if tl.get(us) != want:
            sys.exit(f"FAIL: timeline at {us} us: {tl.get(us)}")
    # Co-residency: the grouped launch has 2 blocks on SM 0 (runs 4 and 10 us) and 1 on SM 1 (4 us).
    co = [x for x in lines if " on the SM: " in x]
    if co != ["lean    2816x2048  grouped   1 on the SM:       2 blocks, run    4.00 us",
              "lean    2816x2048  grouped   2 on the SM:       4 blocks, run    7.00 us",
              "lean    5632x2048  dense     1 on the SM:       4 blocks, run   10.00 us"]:
        sys.exit(f"FAIL: co-residency {co}")
    # One order of residency only: no order listing unless asked (--orders).
    if "order of residency" in out or "2 windows in this order" not in run(good, "--orders").stdout:
        sys.exit("FAIL: orders with one order")
    # A third window where the grouped launch became resident first: two orders, each listed.
    raced = os.path.join(d, "raced.csv")
    with open(raced, "w") as f:
        f.write(HEAD + "\n")
        for t in (1_000_000, 3_000_000):
            for r in step(t):
                f.write(",".join(str(x) for x in r) + "\n")
        for r in step(5_000_000):
            r = list(r)
            if r[3] == "b0":  # the grouped blocks resident 1 us before the dense ones (the window's start)
                r[0], r[1], r[2] = r[0] - 2000, r[1] - 2000, r[2] - 2000
            f.write(",".join(str(x) for x in r) + "\n")
    ol = run(raced).stdout.splitlines()
    i = ol.index("   2 windows in this order of residency (start, end: us from the window's first block):")
    j = ol.index("   1 windows in this order of residency (start, end: us from the window's first block):")
    if ol[i + 1].split()[:3] != ["lean", "5632x2048", "dense"] or ol[i + 1].split()[3:] != ["0.00", "10.00"] or \
            ol[j + 1].split()[:3] != ["lean", "2816x2048", "grouped"] or ol[j + 1].split()[3:] != ["0.00", "11.00"] or \
            ol[j + 2].split()[:3] != ["lean", "5632x2048", "dense"] or ol[j + 2].split()[3:] != ["1.00", "11.00"]:
        sys.exit(f"FAIL: orders {ol[i:i + 3]} {ol[j:j + 3]}")
    # --skip-windows 1 leaves one window.
    if not run(good, "--skip-windows", "1").stdout.startswith("10 blocks, 2 launches in 1 windows"):
        sys.exit("FAIL: --skip-windows")

    # Bad input: one error naming the file (and line), exit 1.
    for name, body, needle in [
        ("head.csv", "t0,t1\n", "head.csv:1: expected the header"),
        ("short.csv", HEAD + "\n1,2,3\n", "short.csv:2: expected 11 fields"),
        ("order.csv", HEAD + "\n5,6,4,a,1,1,1,0,0,0,0\n", "order.csv:2: times out of order"),
        ("empty.csv", HEAD + "\n", "empty.csv: no blocks"),
    ]:
        p = os.path.join(d, name)
        with open(p, "w") as f:
            f.write(body)
        r = run(p, ok=False)
        if needle not in r.stderr or r.stdout:
            sys.exit(f"FAIL: {name}: {r.stderr!r} / {r.stdout!r}")
    r = run(os.path.join(d, "missing.csv"), ok=False)
    if "missing.csv" not in r.stderr:
        sys.exit(f"FAIL: missing file: {r.stderr}")

print("block_stamps_summary: launches, windows, roles, per-SM figures, timeline and bad input as expected")
