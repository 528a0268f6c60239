#!/usr/bin/env python3
"""Summarise an `ncu --csv --metrics gpu__time_duration.sum` log of atlas forward passes.

ncu serialises kernels, so per-kernel durations are exact but the gaps between launches are not
those of a real run (CUDA graphs hide most of them there). Used to find where a decode step or a
prefill spends its device time (docs/cuda-sessions.md, "Profiles").

  tools/profile/ncu_summary.py LOG.csv [--split-after KERNEL_SUBSTRING] [--top N]

Kernels are grouped by (name without template arguments, grid, block). With --split-after, the log
is cut into forward passes after each launch of a kernel whose name contains the substring (e.g. the
device argmax, the last launch of a forward with last-token logits) and each pass is summarised.
"""
import argparse
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    n = re.sub(r"<.*>", "<>", name)
    n = re.sub(r"\(.*\)", "", n)
    return n.split("::")[-1][:60]


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    r = csv.DictReader(lines)
    for x in r:
        if x.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(x["Metric Value"].replace(",", ""))
        unit = x.get("Metric Unit", "nsecond")
        us = v / 1000.0 if unit.startswith("n") else (v if unit.startswith("u") else v * 1000.0)
        yield {"id": int(x["ID"]), "name": x["Kernel Name"], "grid": x.get("Grid Size", ""),
               "block": x.get("Block Size", ""), "us": us}


def summarise(title, ks, top):
    total = sum(k["us"] for k in ks)
    groups = OrderedDict()
    for k in ks:
        key = (short(k["name"]), k["grid"], k["block"])
        g = groups.setdefault(key, [0, 0.0])
        g[0] += 1
        g[1] += k["us"]
    print(f"## {title}: {len(ks)} kernels, {total:.1f} us of kernel time")
    print(f"{'us total':>10} {'%':>5} {'calls':>6} {'us/call':>8}  kernel  grid  block")
    for (n, grid, block), (c, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{us:10.1f} {100 * us / max(total, 1e-9):5.1f} {c:6d} {us / c:8.2f}  {n}  {grid}  {block}")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--split-after", default=None)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    ks = sorted(rows(a.log), key=lambda k: k["id"])
    if not ks:
        sys.exit(f"{a.log}: no gpu__time_duration.sum rows")
    if not a.split_after:
        summarise("all", ks, a.top)
        return
    passes, cur = [], []
    for k in ks:
        cur.append(k)
        if a.split_after in k["name"]:
            passes.append(cur)
            cur = []
    if cur:
        passes.append(cur)
    for i, p in enumerate(passes):
        summarise(f"pass {i}", p, a.top)


if __name__ == "__main__":
    main()
