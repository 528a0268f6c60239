#!/usr/bin/env python3
"""Where the MoE phase's GEMM blocks ran, from an ATLAS_BLOCK_STAMPS file (kernels/block_stamp.cuh).

Each line of the file is one block of a stamped launch: %globaltimer at its start (t0), after its
launch-overlap wait and tile lookup (go; 0: no tile, or a kernel that did not mark it: then the
block's run counts from t0) and at its end (t1), the launch's weight address (site), N, K, grid,
block index, SM, kind (low 4 bits: 0 the lean stream loop, 1 the tiled kernel, 2 split-K; +16: a
grouped launch) and the weight bytes it copied.

Blocks are gathered into launches (one site, shape and grid; a new launch of the same site where
its blocks' starts are more than --gap-us apart: a site recurs once per decode step), launches
into windows (launches whose spans overlap: one layer's MoE phase, the shared experts' launches
beside the routed ones). Printed:
  1. per role (kind, shape, grouped or dense): launches, blocks per launch, and medians over
     every block of the block's wait (go - t0), its run (t1 - go, or t1 - t0 unmarked), its bytes
     and rate (bytes / run), and each launch's start and end in its window (from the window's
     first block start);
  2. per window composition (the roles it holds), medians over its windows: the span, the bytes,
     the SMs that ran a block, each SM's bytes and busy time (the union of its blocks' runs;
     min / median / max over the SMs), and the most blocks resident on one SM at once;
  3. with --timeline, the median over those windows of the blocks resident and running at each
     microsecond of the window (the slots a phase leaves idle);
  4. per window composition, its windows grouped by the order in which their launches' first
     blocks became resident (a race between streams shows as two orders), with each launch's start
     and end (medians, us from the window's first block) in each order;
  5. per role, the blocks' run time by how many blocks of the same launch ran on their SM (1, 2,
     3 ...): flat means each block is bound by itself, not by its SM (session 38's question).

  python3 tools/profile/block_stamps_summary.py stamps.csv [--skip-windows 10] [--timeline]
"""
import argparse
import collections
import statistics
import sys

FIELDS = ["t0_ns", "go_ns", "t1_ns", "site", "n", "k", "grid", "block", "smid", "kind", "bytes"]
KINDS = {0: "lean", 1: "tiled", 2: "splitk"}


def die(msg):
    print("block_stamps_summary: " + msg, file=sys.stderr)
    sys.exit(1)


def load(path):
    try:
        f = open(path)
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    rows = []
    with f:
        head = f.readline().strip()
        if head.split(",") != FIELDS:
            die(f"{path}:1: expected the header {','.join(FIELDS)!r}, got {head!r}")
        for n, line in enumerate(f, 2):
            p = line.strip().split(",")
            if p == [""]:
                continue
            try:
                if len(p) != len(FIELDS):
                    raise ValueError
                t0, go, t1 = int(p[0]), int(p[1]), int(p[2])
                site = int(p[3], 16)
                nn, kk, grid, block, smid, kind, nbytes = (int(x) for x in p[4:])
            except ValueError:
                die(f"{path}:{n}: expected {len(FIELDS)} fields ({','.join(FIELDS)}), got {line.strip()!r}")
            if t1 < t0 or (go and not t0 <= go <= t1):
                die(f"{path}:{n}: times out of order (t0 {t0}, go {go}, t1 {t1})")
            rows.append(dict(t0=t0, go=go or t0, t1=t1, site=site, n=nn, k=kk, grid=grid,
                             block=block, smid=smid, kind=kind, bytes=nbytes))
    if not rows:
        die(f"{path}: no blocks")
    return rows


def role(r):
    return "%-6s %5dx%-5d %s" % (KINDS.get(r["kind"] & 15, "kind%d" % (r["kind"] & 15)), r["n"], r["k"],
                                 "grouped" if r["kind"] & 16 else "dense")


def launches_of(rows, gap_ns):
    by_key = collections.defaultdict(list)
    for r in rows:
        by_key[(r["site"], r["n"], r["k"], r["grid"], r["kind"])].append(r)
    out = []
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r["t0"])
        cur = [rs[0]]
        for r in rs[1:]:
            if r["t0"] - cur[-1]["t0"] > gap_ns:
                out.append(cur)
                cur = []
            cur.append(r)
        out.append(cur)
    return [dict(role=role(b[0]), blocks=b, start=min(r["t0"] for r in b), end=max(r["t1"] for r in b)) for b in out]


def windows_of(launches):
    ls = sorted(launches, key=lambda x: x["start"])
    out, cur, end = [], [], None
    for x in ls:
        if cur and x["start"] > end:
            out.append(cur)
            cur = []
        cur.append(x)
        end = x["end"] if len(cur) == 1 else max(end, x["end"])
    if cur:
        out.append(cur)
    return out


def union_ns(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def max_overlap(intervals):
    ev = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def med(xs):
    return statistics.median(xs) if xs else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stamps")
    ap.add_argument("--gap-us", type=float, default=500.0, help="a new launch of a site after this gap (default 500)")
    ap.add_argument("--skip-windows", type=int, default=0, help="leave out the first N windows (warm-up)")
    ap.add_argument("--timeline", action="store_true", help="resident / running blocks per microsecond")
    ap.add_argument("--orders", action="store_true", help="the orders of residency even where there is one only")
    a = ap.parse_args()
    rows = load(a.stamps)
    wins = windows_of(launches_of(rows, int(a.gap_us * 1000)))[a.skip_windows:]
    if not wins:
        die(f"{a.stamps}: no window left after --skip-windows {a.skip_windows}")
    print(f"{len(rows)} blocks, {sum(len(w) for w in wins)} launches in {len(wins)} windows")

    print("\n== per role: medians over blocks (wait, run: us; bytes: KB; rate: GB/s) and launches (start, end: us "
          "from the window's first block)")
    per = collections.defaultdict(lambda: dict(n=0, blocks=[], waits=[], runs=[], kb=[], rate=[], start=[], end=[]))
    for w in wins:
        w0 = min(x["start"] for x in w)
        for x in w:
            d = per[x["role"]]
            d["n"] += 1
            d["blocks"].append(len(x["blocks"]))
            d["start"].append((x["start"] - w0) / 1e3)
            d["end"].append((x["end"] - w0) / 1e3)
            for r in x["blocks"]:
                run = r["t1"] - r["go"]
                d["waits"].append((r["go"] - r["t0"]) / 1e3)
                d["runs"].append(run / 1e3)
                d["kb"].append(r["bytes"] / 1024)
                if r["bytes"] and run > 0:
                    d["rate"].append(r["bytes"] / run)
    print("%-28s %8s %7s %7s %7s %8s %7s %7s %7s" % ("role", "launches", "blocks", "wait", "run", "KB", "rate",
                                                  "start", "end"))
    for name, d in sorted(per.items(), key=lambda kv: med(kv[1]["start"])):
        print("%-28s %8d %7d %7.2f %7.2f %8.1f %7.2f %7.2f %7.2f" % (
            name, d["n"], med(d["blocks"]), med(d["waits"]), med(d["runs"]), med(d["kb"]), med(d["rate"]),
            med(d["start"]), med(d["end"])))

    print("\n== per window composition: medians over its windows (span: us; MB; per SM: KB and busy us, "
          "min/median/max over the SMs that ran a block)")
    comp = collections.defaultdict(list)
    for w in wins:
        comp[tuple(sorted(x["role"] for x in w))].append(w)
    for roles, ws in sorted(comp.items(), key=lambda kv: -len(kv[1])):
        spans, mbs, sms, kb_lo, kb_md, kb_hi, busy_lo, busy_md, busy_hi, res = [], [], [], [], [], [], [], [], [], []
        for w in ws:
            blocks = [r for x in w for r in x["blocks"]]
            w0, w1 = min(r["t0"] for r in blocks), max(r["t1"] for r in blocks)
            spans.append((w1 - w0) / 1e3)
            mbs.append(sum(r["bytes"] for r in blocks) / 1e6)
            by_sm = collections.defaultdict(list)
            for r in blocks:
                by_sm[r["smid"]].append(r)
            sms.append(len(by_sm))
            kb = [sum(r["bytes"] for r in rs) / 1024 for rs in by_sm.values()]
            busy = [union_ns([(r["go"], r["t1"]) for r in rs]) / 1e3 for rs in by_sm.values()]
            kb_lo.append(min(kb)), kb_md.append(med(kb)), kb_hi.append(max(kb))
            busy_lo.append(min(busy)), busy_md.append(med(busy)), busy_hi.append(max(busy))
            res.append(max(max_overlap([(r["t0"], r["t1"]) for r in rs]) for rs in by_sm.values()))
        print(f"{len(ws)} windows of: " + "; ".join(r.strip() for r in roles))
        print("   span %.2f us, %.2f MB, %d SMs; per SM: %.0f/%.0f/%.0f KB, busy %.2f/%.2f/%.2f us; at most %d blocks "
              "resident on one SM" % (med(spans), med(mbs), med(sms), med(kb_lo), med(kb_md), med(kb_hi), med(busy_lo),
                                      med(busy_md), med(busy_hi), max(res)))
        orders = collections.defaultdict(list)  # order -> [(the window's start, its launches in order)]
        for w in ws:
            ordered = sorted(w, key=lambda x: (x["start"], x["role"]))
            orders[tuple(x["role"] for x in ordered)].append((ordered[0]["start"], ordered))
        if len(orders) > 1 or a.orders:
            for order, ows in sorted(orders.items(), key=lambda kv: -len(kv[1])):
                print("   %d windows in this order of residency (start, end: us from the window's first block):" % len(ows))
                for i, name in enumerate(order):
                    st = [(o[i]["start"] - w0) / 1e3 for w0, o in ows]
                    en = [(o[i]["end"] - w0) / 1e3 for w0, o in ows]
                    print("     %-28s %7.2f %7.2f" % (name, med(st), med(en)))
        if a.timeline:
            lines = collections.defaultdict(lambda: ([], []))
            for w in ws:
                blocks = [r for x in w for r in x["blocks"]]
                w0 = min(r["t0"] for r in blocks)
                end_us = int((max(r["t1"] for r in blocks) - w0) // 1000) + 1
                for us in range(end_us):
                    t = w0 + us * 1000 + 500
                    lines[us][0].append(sum(1 for r in blocks if r["t0"] <= t < r["t1"]))
                    lines[us][1].append(sum(1 for r in blocks if r["go"] <= t < r["t1"]))
            print("   us  resident  running (medians; windows shorter than a row count as 0 there)")
            for us in sorted(lines):
                res_us, run_us = lines[us]
                pad = [0] * (len(ws) - len(res_us))
                print("   %3d  %8.0f  %7.0f" % (us, med(res_us + pad), med(run_us + pad)))
    coresidency(wins)


def coresidency(wins):
    print("\n== per role: block run (us, medians) by the blocks of the same launch on its SM (blocks that moved bytes)")
    runs = collections.defaultdict(list)
    for w in wins:
        for x in w:
            live = [r for r in x["blocks"] if r["bytes"] > 0]
            per_sm = collections.Counter(r["smid"] for r in live)
            for r in live:
                runs[(x["role"], per_sm[r["smid"]])].append((r["t1"] - r["go"]) / 1e3)
    for (name, n), v in sorted(runs.items()):
        print("%-28s %d on the SM: %7d blocks, run %7.2f us" % (name, n, len(v), med(v)))


if __name__ == "__main__":
    main()
