#!/usr/bin/env python3
"""Independent check of `atlas analyze` against the written definitions (docs/stats.md).

A synthetic analysis input (3 domains, a 2x2 factorial of conditions, repeats, routes with
target ranges, float32 hidden rows, generated ids with ledgers) is analysed by atlas; every
statistic is then recomputed here from its definition with numpy/scipy:
  - expert loads by pooling the drawn sources' tokens (token-weighted) or averaging their
    per-source distributions (prompt-balanced); CV = np.std / np.mean; TV; JSD from
    scipy.spatial.distance.jensenshannon(base=2) squared; top-k agreement from Python sets;
  - hidden cosine / relative L2 per row and pooled with numpy norms; exact rows by bytes;
  - Levenshtein by a full-matrix dynamic programme; prefixes, similarity, uniqueness, ledgers;
  - paired correctness per edge (pairs where both cells have a verdict) and its counts;
  - the bootstrap by redrawing every replicate's source indices with an independent Philox4x32-10
    (from the SC11 round function) and recomputing each statistic on the literally resampled
    source list (sources repeated as drawn), then np.percentile(method="linear").
Agreement is required to 1e-12 (relative for values above 1).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from scipy.spatial.distance import jensenshannon

ATLAS = os.environ.get("ATLAS_BIN")
if not ATLAS or not os.path.exists(ATLAS):
    print("ATLAS_BIN not set or missing", file=sys.stderr)
    sys.exit(1)

TOL = 1e-12
failures = []
checks = 0


def close(a, b):
    """a from atlas (NaN is written as null), b computed here."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None
    if a is None:
        return False
    return abs(a - b) <= TOL * max(1.0, abs(b))


def expect(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        if len(failures) < 30:
            print("FAIL:", what)


# ---- Philox4x32-10 (Salmon et al., SC11) and the documented index draw ---------------------
M32 = 0xFFFFFFFF


def philox(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


assert philox((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)


def draw_indices(seed, domain, rep, n):
    out = []
    for j in range(n):
        w = philox((j, rep & M32, rep >> 32, domain), (seed & M32, seed >> 32))
        u = (((w[0] << 32) | w[1]) >> 11) * 2.0 ** -53
        out.append(int(math.floor(u * n)))
    return out


# ---- synthetic input ----------------------------------------------------------------------
rng = np.random.default_rng(7)
E, K, LAYERS, STAGES, HDIM = 8, 3, ["1", "2"], ["embed", "L00", "final"], 5
DOMAINS = ["english", "code", "math"]
CONDS = ["s0f0", "s1f0", "s0f1", "s1f1"]
EDGES = [("system@f0", "s1f0", "s0f0"), ("system@f1", "s1f1", "s0f1"), ("oneshot@s0", "s0f1", "s0f0")]
REPEATS = ["r0", "r1"]
n_per_domain = {"english": 3, "code": 4, "math": 2}
sources = []
for d in DOMAINS:
    for i in range(n_per_domain[d]):
        sources.append({"id": f"{d}-{i}", "domain": d})

cells = []
truth = {}  # (source, cond) -> dict
for s in sources:
    n_target = int(rng.integers(3, 7))
    base_routes = [[list(rng.choice(E, K, replace=False)) for _ in range(n_target)] for _ in LAYERS]
    base_hidden = rng.standard_normal((len(STAGES), n_target, HDIM)).astype(np.float32)
    for ci, c in enumerate(CONDS):
        prefix = int(rng.integers(1, 4)) + (2 if "s1" in c else 0)
        suffix = int(rng.integers(0, 3))
        T = prefix + n_target + suffix
        ids, ws = [], []
        for li in range(len(LAYERS)):
            lid, lw = [], []
            for t in range(T):
                if prefix <= t < prefix + n_target and rng.random() < 0.5:
                    sel = list(base_routes[li][t - prefix])  # often the same route as the base
                    if rng.random() < 0.3:
                        sel = [sel[1], sel[0], sel[2]]  # same set, other order
                else:
                    sel = list(rng.choice(E, K, replace=False))
                w = rng.random(K)
                w = w / w.sum()
                lid.append([int(x) for x in sel])
                lw.append([float(np.float32(x)) for x in w])
            ids.append(lid)
            ws.append(lw)
        hidden = base_hidden.copy()
        if ci > 0:
            noise = (rng.standard_normal(hidden.shape) * 0.1).astype(np.float32)
            keep = rng.random((len(STAGES), n_target)) < 0.3  # some rows stay bitwise equal
            noise[keep] = 0
            noise[0] = 0  # the embedding stage is exact on every edge
            hidden = (hidden + noise).astype(np.float32)
        truth[(s["id"], c)] = {"ids": ids, "ws": ws, "range": (prefix, prefix + n_target), "hidden": hidden}
        cell = {"cell_id": f"{s['id']}/{c}", "source": s["id"], "condition": c,
                "target_range": [prefix, prefix + n_target],
                "routes": {"topk_ids": ids, "topk_weights": ws},
                "hidden": [[[float(v) for v in row] for row in st] for st in hidden]}
        cells.append(cell)
        # generated outputs: two repeats as extra cells without routes
    gen_base = [int(x) for x in rng.integers(0, 50, int(rng.integers(0, 12)))]
    for c in CONDS:
        for r in REPEATS:
            g = list(gen_base)
            if rng.random() < 0.6:
                for _ in range(int(rng.integers(1, 4))):
                    op = rng.integers(0, 3)
                    pos = int(rng.integers(0, len(g) + 1))
                    if op == 0:
                        g.insert(pos, int(rng.integers(0, 50)))
                    elif op == 1 and g:
                        g.pop(min(pos, len(g) - 1))
                    elif g:
                        g[min(pos, len(g) - 1)] = int(rng.integers(0, 50))
            cell = {"cell_id": f"{s['id']}/{c}/{r}", "source": s["id"], "condition": c, "repeat": r,
                    "generated_ids": g}
            if rng.random() < 0.9:
                cell["stop"] = "eos" if rng.random() < 0.7 else "length"
            if rng.random() < 0.8:
                cell["evaluable"] = bool(rng.random() < 0.8)
            if s["domain"] != "english" and rng.random() < 0.9:
                cell["correct"] = bool(rng.random() < 0.5)
            cells.append(cell)

doc = {"format": "atlas-analysis-input-v1", "manifest_sha256": "ab" * 32, "experts": E, "top_k": K,
       "layers": [int(x) for x in LAYERS], "hidden_stages": STAGES, "domains": DOMAINS, "conditions": CONDS,
       "sources": sources, "cells": cells,
       "edges": [{"name": n, "condition": a, "reference": b} for n, a, b in EDGES],
       "factorials": [{"name": "system x oneshot", "a": "system", "b": "oneshot",
                       "a0b0": "s0f0", "a1b0": "s1f0", "a0b1": "s0f1", "a1b1": "s1f1"}]}

R_SEED, R_REPS, T_SEED, T_REPS, LEVEL = 12345, 40, 999, 30, 0.9
tmp = tempfile.mkdtemp()
inp = os.path.join(tmp, "input.json")
with open(inp, "w") as f:
    json.dump(doc, f)
out = os.path.join(tmp, "out")
subprocess.run([ATLAS, "analyze", inp, "--out", out, "--replicates", str(R_REPS), "--seed", str(R_SEED),
                "--task-replicates", str(T_REPS), "--task-seed", str(T_SEED), "--level", str(LEVEL),
                "--bootstrap-full-scope", "--bootstrap-weighted"],
               check=True, stdout=subprocess.DEVNULL)
A = json.load(open(os.path.join(out, "analysis.json")))

groups = {d: [s["id"] for s in sources if s["domain"] == d] for d in DOMAINS}
groups["all"] = [sid for d in DOMAINS for sid in groups[d]]


def replicate_sources(group, seed, rep):
    """The resampled source list of one replicate (sources repeated as drawn)."""
    doms = DOMAINS if group == "all" else [group]
    out = []
    for d in doms:
        members = groups[d]
        out += [members[i] for i in draw_indices(seed, DOMAINS.index(d), rep, len(members))]
    return out


def interval(values):
    v = np.array([x for x in values if not (x is None or math.isnan(x))], dtype=np.float64)
    if len(v) == 0:
        return None
    return [float(np.percentile(v, 100 * (1 - LEVEL) / 2, method="linear")),
            float(np.percentile(v, 100 * (1 + LEVEL) / 2, method="linear"))]


def check_row(row, fn, seed, reps, what):
    """fn(list of source ids) -> value; compares the point value and the interval."""
    point = fn(groups[row["domain"]])
    expect(close(row["value"], point), f"{what}: value {row['value']} vs {point}")
    ci = interval([fn(replicate_sources(row["domain"], seed, r)) for r in range(reps)])
    got = row.get("ci")
    if ci is None:
        expect(got is None, f"{what}: ci {got} vs none")
    else:
        expect(got is not None and close(got[0], ci[0]) and close(got[1], ci[1]), f"{what}: ci {got} vs {ci}")


# ---- routing ------------------------------------------------------------------------------

def selections(sid, c, li, scope, kind):
    """Per-token (ids, weights) in scope."""
    t = truth[(sid, c)]
    lo, hi = t["range"]
    out = []
    for tok in range(len(t["ids"][li])):
        if scope == "target" and not (lo <= tok < hi):
            continue
        out.append((t["ids"][li][tok], t["ws"][li][tok]))
    return out


def load_vector(sel, kind):
    v = np.zeros(E)
    for ids, ws in sel:
        for e, w in zip(ids, ws):
            v[e] += 1.0 if kind == "count" else w
    return v


def dist(srcs, c, li, scope, kind, agg):
    if agg == "token":
        v = sum(load_vector(selections(s, c, li, scope, kind), kind) for s in srcs)
        return v / v.sum()
    return np.mean([load_vector(selections(s, c, li, scope, kind), kind) /
                    load_vector(selections(s, c, li, scope, kind), kind).sum() for s in srcs], axis=0)


def cv(p):
    return float(np.std(p) / np.mean(p))


def tv(p, q):
    return float(0.5 * np.abs(p - q).sum())


def jsd(p, q):
    return float(jensenshannon(p, q, base=2) ** 2)


def agreement(srcs, a, b, li, which):
    num = den = 0.0
    for s in srcs:
        ta = [x for x, _ in selections(s, a, li, "target", "count")]
        tb = [x for x, _ in selections(s, b, li, "target", "count")]
        for x, y in zip(ta, tb):
            if which == "ordered_exact_rate":
                num += list(x) == list(y)
            elif which == "set_exact_rate":
                num += set(x) == set(y)
            else:
                num += len(set(x) & set(y)) / len(set(x) | set(y))
            den += 1
    return num / den


edge_of = {n: (a, b) for n, a, b in EDGES}
fac = doc["factorials"][0]
m_cells = {(0, 0): fac["a0b0"], (1, 0): fac["a1b0"], (0, 1): fac["a0b1"], (1, 1): fac["a1b1"]}
routing_rows = A["routing"]["stats"]
expect(len(routing_rows) == len(LAYERS) * 4 * (2 * 2 * 2 * (len(CONDS) + 2 * len(EDGES) + 5) + 3 * len(EDGES)),
       f"routing row count {len(routing_rows)}")
for row in routing_rows:
    li = LAYERS.index(row["layer"])
    m = row["metric"]
    if m in ("ordered_exact_rate", "set_exact_rate", "jaccard"):
        a, b = edge_of[row["edge"]]
        fn = lambda srcs, a=a, b=b, li=li, m=m: agreement(srcs, a, b, li, m)
    else:
        sc, kind, agg = row["scope"], row["kind"], row["aggregation"]
        D = lambda srcs, c, sc=sc, kind=kind, agg=agg, li=li: dist(srcs, c, li, sc, kind, agg)
        if m == "cv":
            fn = lambda srcs, c=row["condition"], D=D: cv(D(srcs, c))
        elif m in ("tv", "jsd_bits"):
            a, b = edge_of[row["edge"]]
            f2 = tv if m == "tv" else jsd
            fn = lambda srcs, a=a, b=b, D=D, f2=f2: f2(D(srcs, a), D(srcs, b))
        else:
            def fn(srcs, m=m, D=D):
                d = {k: D(srcs, c) for k, c in m_cells.items()}
                cvs = {k: cv(v) for k, v in d.items()}
                if m == "cv_main_a":
                    return 0.5 * ((cvs[1, 0] - cvs[0, 0]) + (cvs[1, 1] - cvs[0, 1]))
                if m == "cv_main_b":
                    return 0.5 * ((cvs[0, 1] - cvs[0, 0]) + (cvs[1, 1] - cvs[1, 0]))
                if m == "cv_did":
                    return (cvs[1, 1] - cvs[0, 1]) - (cvs[1, 0] - cvs[0, 0])
                if m == "tv_a_edge_modulation":
                    return tv(d[1, 1], d[0, 1]) - tv(d[1, 0], d[0, 0])
                if m == "tv_b_edge_modulation":
                    return tv(d[1, 1], d[1, 0]) - tv(d[0, 1], d[0, 0])
                raise AssertionError(m)
    check_row(row, fn, R_SEED, R_REPS, f"routing {row}")

# Loads: raw counts and weight sums, token-weighted, per scope.
for row in A["routing"]["loads"]:
    li = LAYERS.index(row["layer"])
    cnt = sum(load_vector(selections(s, row["condition"], li, row["scope"], "count"), "count") for s in groups[row["domain"]])
    wt = sum(load_vector(selections(s, row["condition"], li, row["scope"], "weight"), "weight") for s in groups[row["domain"]])
    expect(row["load"] == [int(x) for x in cnt], f"load {row['layer']} {row['domain']} {row['condition']}")
    expect(all(close(x, y) for x, y in zip(row["weighted_load"], wt)), f"weighted load {row['domain']}")

# ---- hidden states ------------------------------------------------------------------------

def hidden_stat(srcs, a, b, st, m):
    rows_a = np.concatenate([truth[(s, a)]["hidden"][st] for s in srcs]).astype(np.float64)
    rows_b = np.concatenate([truth[(s, b)]["hidden"][st] for s in srcs]).astype(np.float64)
    if m == "cosine_row_mean":
        return float(np.mean([x @ y / (np.linalg.norm(x) * np.linalg.norm(y)) for x, y in zip(rows_a, rows_b)]))
    if m == "relative_l2_row_mean":
        return float(np.mean([np.linalg.norm(x - y) / np.linalg.norm(y) for x, y in zip(rows_a, rows_b)]))
    if m == "cosine_pooled":
        return float((rows_a * rows_b).sum() / (np.linalg.norm(rows_a) * np.linalg.norm(rows_b)))
    if m == "relative_l2_pooled":
        return float(np.linalg.norm(rows_a - rows_b) / np.linalg.norm(rows_b))
    ra = np.concatenate([truth[(s, a)]["hidden"][st] for s in srcs])
    rb = np.concatenate([truth[(s, b)]["hidden"][st] for s in srcs])
    return float(np.mean([x.tobytes() == y.tobytes() for x, y in zip(ra, rb)]))


for row in A["hidden"]["stats"]:
    a, b = edge_of[row["edge"]]
    st = STAGES.index(row["stage"])
    check_row(row, lambda srcs, a=a, b=b, st=st, m=row["metric"]: hidden_stat(srcs, a, b, st, m), R_SEED, R_REPS,
              f"hidden {row}")
    if row["metric"] == "exact_row_rate":
        ra = np.concatenate([truth[(s, a)]["hidden"][st] for s in groups[row["domain"]]])
        rb = np.concatenate([truth[(s, b)]["hidden"][st] for s in groups[row["domain"]]])
        n_exact = sum(x.tobytes() == y.tobytes() for x, y in zip(ra, rb))
        expect(row["exact_rows"] == n_exact and row["rows"] == len(ra), f"exact rows {row}")
for mc in A["hidden"]["min_cosine_stage"]:
    a, b = edge_of[mc["edge"]]
    vals = [hidden_stat(groups[mc["domain"]], a, b, st, mc["metric"]) for st in range(len(STAGES))]
    expect(mc["stage"] == STAGES[int(np.argmin(vals))] and close(mc["value"], min(vals)), f"min cosine {mc}")

# ---- outputs ------------------------------------------------------------------------------
gen = {(c["source"], c["condition"], c["repeat"]): c for c in cells if "generated_ids" in c}


def lev_full(a, b):
    D = np.zeros((len(a) + 1, len(b) + 1), dtype=np.int64)
    D[:, 0] = np.arange(len(a) + 1)
    D[0, :] = np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            D[i, j] = min(D[i - 1, j] + 1, D[i, j - 1] + 1, D[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
    return int(D[len(a), len(b)])


assert lev_full([1, 2, 3], [2, 3, 4]) == 2 and lev_full([], [5, 6]) == 2


def prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pair_values(srcs, a, b, m):
    vals = []
    for s in srcs:
        for r in REPEATS:
            x, y = gen[(s, a, r)]["generated_ids"], gen[(s, b, r)]["generated_ids"]
            if m.startswith("correct_rate_"):
                # Paired correctness: only pairs where both cells have a verdict.
                ka, kb = gen[(s, a, r)].get("correct"), gen[(s, b, r)].get("correct")
                if ka is None or kb is None:
                    continue
                vals.append({"correct_rate_difference": float(ka) - float(kb), "correct_rate_condition": float(ka),
                             "correct_rate_reference": float(kb)}[m])
            elif m == "exact_rate":
                vals.append(float(x == y))
            elif m == "mean_common_prefix":
                vals.append(prefix(x, y))
            elif m == "mean_levenshtein":
                vals.append(lev_full(x, y))
            else:
                n = max(len(x), len(y))
                vals.append(1.0 if n == 0 else 1 - lev_full(x, y) / n)
    return float(np.mean(vals)) if vals else float("nan")


for row in A["outputs"]["stats"]:
    if row["metric"] == "correct_rate_difference":
        a, b = edge_of[row["edge"]]
        pairs = [(gen[(s, a, r)].get("correct"), gen[(s, b, r)].get("correct")) for s in groups[row["domain"]] for r in REPEATS]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        expect((row["pairs"], row["both_correct"], row["condition_only"], row["reference_only"], row["neither"]) ==
               (len(pairs), sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs),
                sum(y and not x for x, y in pairs), sum(not x and not y for x, y in pairs)), f"correct counts {row}")
    a, b = edge_of[row["edge"]]
    check_row(row, lambda srcs, a=a, b=b, m=row["metric"]: pair_values(srcs, a, b, m), R_SEED, R_REPS,
              f"outputs {row}")

for u in A["outputs"]["uniqueness"]:
    seqs = {tuple(c["generated_ids"]) for k, c in gen.items()
            if k[0] in groups[u["domain"]] and (u["condition"] == "all" or k[1] == u["condition"])}
    expect(u["distinct"] == len(seqs), f"uniqueness {u}")
for lg in A["outputs"]["ledgers"]:
    sel = [c for k, c in gen.items() if k[0] in groups[lg["domain"]] and (lg["condition"] == "all" or k[1] == lg["condition"])]
    expect(lg["stopping"] == {"eos": sum(c.get("stop") == "eos" for c in sel),
                              "length": sum(c.get("stop") == "length" for c in sel),
                              "unknown": sum("stop" not in c for c in sel)}, f"stopping {lg}")
    expect(lg["correctness"] == {"correct": sum(c.get("correct") is True for c in sel),
                                 "incorrect": sum(c.get("correct") is False for c in sel),
                                 "unknown": sum("correct" not in c for c in sel)}, f"correctness {lg}")
    expect(lg["evaluability"]["evaluable"] == sum(c.get("evaluable") is True for c in sel), f"evaluable {lg}")

# ---- tasks --------------------------------------------------------------------------------

def var(c, q):
    if q == "generated_length":
        return float(len(c["generated_ids"]))
    if q == "eos":
        return None if "stop" not in c else float(c["stop"] == "eos")
    return None if "correct" not in c else float(c["correct"])


def task_value(srcs, m, cond=None, edge=None):
    per = []
    for s in srcs:
        if cond is not None:
            v = [var(gen[(s, cond, r)], m) for r in REPEATS]
            v = [x for x in v if x is not None]
        else:
            a, b = edge_of[edge]
            v = [var(gen[(s, a, r)], m) - var(gen[(s, b, r)], m) for r in REPEATS
                 if var(gen[(s, a, r)], m) is not None and var(gen[(s, b, r)], m) is not None]
        if v:
            per.append(np.mean(v))
    return float(np.mean(per)) if per else float("nan")


for row in A["tasks"]["stats"]:
    m = row["metric"]
    if m.startswith("mean_"):
        fn = lambda srcs, q=m[5:], c=row["condition"]: task_value(srcs, q, cond=c)
    else:
        fn = lambda srcs, q=m[len("source_blocked_"):], e=row["edge"]: task_value(srcs, q, edge=e)
    check_row(row, fn, T_SEED, T_REPS, f"tasks {row}")

for b in A["tasks"]["source_blocked"]:
    vals = []
    for s in groups[b["domain"]]:
        v = task_value([s], b["variable"], edge=b["edge"])
        if not math.isnan(v):
            vals.append(v)
    expect((b["up"], b["down"], b["zero"]) == (sum(v > 0 for v in vals), sum(v < 0 for v in vals),
                                               sum(v == 0 for v in vals)), f"directions {b['edge']} {b['domain']}")
    expect(all(close(x["value"], y) for x, y in zip(b["sources"], vals)) and len(b["sources"]) == len(vals),
           f"source values {b['edge']} {b['variable']} {b['domain']}")

# ---- determinism: same input, other thread count -> identical analysis (runtime aside) -----
out2 = os.path.join(tmp, "out2")
subprocess.run([ATLAS, "analyze", inp, "--out", out2, "--replicates", str(R_REPS), "--seed", str(R_SEED),
                "--task-replicates", str(T_REPS), "--task-seed", str(T_SEED), "--level", str(LEVEL), "--threads", "1",
                "--bootstrap-full-scope", "--bootstrap-weighted"],
               check=True, stdout=subprocess.DEVNULL)
B = json.load(open(os.path.join(out2, "analysis.json")))
A.pop("runtime"), B.pop("runtime")
expect(A == B, "analysis differs between thread counts")
for name in os.listdir(out):
    if name != "analysis.json":
        expect(open(os.path.join(out, name), "rb").read() == open(os.path.join(out2, name), "rb").read(),
               f"{name} differs between runs")

# ---- default resampling: count-load distributions of both scopes get intervals -------------
out3 = os.path.join(tmp, "out3")
subprocess.run([ATLAS, "analyze", inp, "--out", out3, "--replicates", str(R_REPS), "--seed", str(R_SEED),
                "--task-replicates", str(T_REPS), "--task-seed", str(T_SEED), "--level", str(LEVEL)],
               check=True, stdout=subprocess.DEVNULL)
C3 = json.load(open(os.path.join(out3, "analysis.json")))
for full_row, row in zip(A["routing"]["stats"], C3["routing"]["stats"]):
    expect(full_row["value"] == row["value"], f"default run changed a value: {row}")
    narrowed = "kind" in row and row["kind"] == "weight"
    if narrowed:
        expect(row.get("ci") is None, f"default run resampled {row}")
    else:
        expect(row.get("ci") == full_row.get("ci"), f"default run changed an interval: {row}")

# --no-bootstrap-full-scope: the full scope keeps point values too.
out4 = os.path.join(tmp, "out4")
subprocess.run([ATLAS, "analyze", inp, "--out", out4, "--replicates", str(R_REPS), "--seed", str(R_SEED),
                "--task-replicates", str(T_REPS), "--task-seed", str(T_SEED), "--level", str(LEVEL),
                "--no-bootstrap-full-scope"], check=True, stdout=subprocess.DEVNULL)
C4 = json.load(open(os.path.join(out4, "analysis.json")))
for full_row, row in zip(A["routing"]["stats"], C4["routing"]["stats"]):
    narrowed = "kind" in row and (row["scope"] == "full" or row["kind"] == "weight")
    expect(row.get("ci") is None if narrowed else row.get("ci") == full_row.get("ci"), f"--no-bootstrap-full-scope: {row}")

print(f"{checks} checks, {len(failures)} failures")
sys.exit(1 if failures else 0)
