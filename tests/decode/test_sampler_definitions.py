#!/usr/bin/env python3
"""Independent check of atlas's decoding contracts (docs/decoding.md).

Everything expected here is computed from the written definitions, not from atlas's code:
Philox4x32-10 from the SC11 paper's round function, the CRN tape from its SHA-256 pre-image,
and the warpers in Hugging Face's convention (temperature, top-k with ties kept, top-p removing
cumulative <= 1 - top_p in (logit, id) ascending order, always keeping the last), softmax with
exact sums, and the inverse CDF over float32 running sums in token-id order. The results are
compared with `atlas sample-debug`.

Exact equality is required everywhere. The one step where two correct implementations may
round differently is e_i = float32(exp(s_i - max)): atlas uses its own portable double-precision
routine, this test float32(math.exp(double)); both are correctly rounded except within ~1e-16
of a float32 rounding midpoint. So a top-p cut within a relative 1e-6 of the threshold (but not
on it) whose survivors differ, or a token whose u lies within 1e-6 of a CDF boundary while the
probabilities differ, counts as ambiguous and is accepted; the test fails if more than 2% of
checks are ambiguous (in practice there are none).
"""
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ATLAS = os.environ.get("ATLAS_BIN")
if not ATLAS or not os.path.exists(ATLAS):
    print("ATLAS_BIN not set or missing", file=sys.stderr)
    sys.exit(1)

MASK32 = 0xFFFFFFFF
failures = []
checks = 0
ambiguous = 0
inexact_probs = 0


def expect(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---- Philox4x32-10 from its definition ----------------------------------------------------

def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & MASK32
            k1 = (k1 + 0xBB67AE85) & MASK32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return (c0, c1, c2, c3)


assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == (
    0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def philox_u(seed, stream, step):
    w = philox4x32_10((0, step & MASK32, step >> 32, stream), (seed & MASK32, seed >> 32))
    return (((w[0] << 32) | w[1]) >> 11) * 2.0 ** -53


def philox_state(seed, stream):
    pre = b"atlas-rng-state-v1:philox4x32-10" + struct.pack("<6I", seed & MASK32, seed >> 32, 0, 0, 0, stream)
    return hashlib.sha256(pre).hexdigest()


def crn_body(tape, key, t):
    k = key.encode()
    return struct.pack("<QI", tape, len(k)) + k + struct.pack("<Q", t)


def crn_u(tape, key, t):
    d = hashlib.sha256(b"atlas-crn-v1" + crn_body(tape, key, t)).digest()
    return (struct.unpack("<Q", d[:8])[0] >> 11) * 2.0 ** -53


def crn_state(tape, key):
    return hashlib.sha256(b"atlas-rng-state-v1:crn-sha256" + crn_body(tape, key, 0)).hexdigest()


# ---- the warpers from the written definition ------------------------------------------------

UNIT = 2 ** 149  # exact sums: float32 values in [0, 2) as integer multiples of 2^-149


def to_units(v):
    return int(float(v) * 2.0 ** 149)  # exact: power-of-two scaling of a float32


def units_to_f32(n):
    """Round n * 2^-149 to float32, to nearest, ties to even."""
    if n < 2 ** 24:
        return np.float32(n * 2.0 ** -149)  # exact (subnormal or small normal)
    shift = n.bit_length() - 24
    m, rem = n >> shift, n & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and m & 1):
        m += 1
    return np.float32(m * 2.0 ** (shift - 149))


def units_to_double(n):
    return n / UNIT  # Python's int true division is correctly rounded


def expected_distribution(logits, T, top_p, top_k):
    """Survivor ids (ascending), their float32 probabilities, and the smallest relative margin
    between a top-p cumulative sum and the threshold (for the ambiguity rule)."""
    x = np.array(logits, dtype=np.float32)
    s = x / np.float32(T)
    V = len(s)
    kth = -np.inf
    if 0 < top_k < V:
        kth = np.sort(s)[::-1][top_k - 1]
    alive = [i for i in range(V) if s[i] >= kth and np.isfinite(s[i])]
    m = max(s[i] for i in alive)
    e = {i: np.float32(math.exp(float(np.float32(s[i] - m)))) for i in alive}
    margin = math.inf
    kept = set(alive)
    if top_p < 1.0:
        S = units_to_double(sum(to_units(e[i]) for i in alive))
        p = {i: np.float32(float(e[i]) / S) for i in alive}
        thr = np.float32(1.0 - top_p)
        order = sorted(alive, key=lambda i: (s[i], i))
        kept = set()
        c = 0
        for j, i in enumerate(order):
            c += to_units(p[i])
            cj = units_to_f32(c)
            if thr > 0 or cj > 0:
                margin = min(margin, abs(float(cj) - float(thr)) / max(float(thr), 1e-30))
            if cj > thr or j == len(order) - 1:
                kept = set(order[j:])
                break
    kept = sorted(kept)
    S2 = units_to_double(sum(to_units(e[i]) for i in kept))
    ids, probs = [], []
    for i in kept:
        q = np.float32(float(e[i]) / S2)
        if q > 0:
            ids.append(i)
            probs.append(q)
    return ids, probs, margin


def expected_token(ids, probs, u):
    """Inverse CDF in id order with float32 running sums; also the distance of u to the
    nearest boundary, relative."""
    c = np.float32(0)
    near = math.inf
    tok = ids[-1]
    found = False
    for i, q in zip(ids, probs):
        c = np.float32(c + q)
        near = min(near, abs(u - float(c)) / max(float(c), 1e-30))
        if not found and u < float(c):
            tok, found = i, True
    return tok, near


# ---- running atlas ----------------------------------------------------------------------------

tmp = tempfile.mkdtemp(prefix="atlas-sampler-")


def write_logits(name, values):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump([v if np.isfinite(v) else ("-inf" if v < 0 else "inf") for v in map(float, values)], f)
    return path


def atlas(*args, ok=True):
    r = subprocess.run([ATLAS, "sample-debug", *map(str, args)], capture_output=True, text=True)
    if ok:
        if r.returncode != 0:
            raise SystemExit(f"atlas sample-debug {' '.join(map(str, args))} failed: {r.stderr}")
        return json.loads(r.stdout)
    return r


def rows():
    rng = np.random.RandomState(20260729)
    out = {}
    out["small"] = rng.normal(0, 2, 64).astype(np.float32)
    out["medium"] = rng.normal(0, 3, 1000).astype(np.float32)
    wide = rng.normal(0, 1.5, 5000).astype(np.float32)
    wide[:40] += 6  # a head of plausible tokens over a long tail: near-1 cumulative sums
    out["wide"] = wide
    ties = np.round(rng.normal(0, 1, 300) * 2).astype(np.float32) / 2  # many exact ties
    out["ties"] = ties
    masked = rng.normal(0, 2, 200).astype(np.float32)
    masked[::3] = -np.inf
    out["masked"] = masked
    out["equal8"] = np.zeros(8, dtype=np.float32)  # probabilities 1/8 exactly
    return out


def check_case(name, path, logits, mode, T, top_p, top_k, steps=6):
    global ambiguous
    if mode == "crn":
        key = f"src-{name}"
        got = atlas("--logits", path, "--mode", "crn", "--tape-seed", 9001, "--row-key", key, "--steps", steps,
                    "--temperature", repr(T), "--top-p", repr(top_p), "--top-k", top_k)
        us = [crn_u(9001, key, t) for t in range(steps)]
        expect(got["rng_state_sha256"] == crn_state(9001, key), f"{name}: crn state hash")
    else:
        got = atlas("--logits", path, "--mode", "seeded", "--seed", 1560062173, "--stream", 3, "--steps", steps,
                    "--temperature", repr(T), "--top-p", repr(top_p), "--top-k", top_k)
        us = [philox_u(1560062173, 3, t) for t in range(steps)]
        expect(got["rng_state_sha256"] == philox_state(1560062173, 3), f"{name}: philox state hash")
    label = f"{name} {mode} T={T} top_p={top_p} top_k={top_k}"
    ids, probs, margin = expected_distribution(logits, T, top_p, top_k)
    if got["survivors"] != ids:
        if 0 < margin < 1e-6:
            ambiguous += 1
            return
        expect(False, f"{label}: survivors {got['survivors'][:10]}... (n={len(got['survivors'])}) "
                      f"!= expected {ids[:10]}... (n={len(ids)})")
        return
    got_probs = np.array(got["probs"], dtype=np.float64)
    exp_probs = np.array([float(q) for q in probs])
    exact = bool(np.array_equal(got_probs, exp_probs))
    if not exact:
        global inexact_probs
        inexact_probs += 1
        close = bool(np.all(np.abs(got_probs - exp_probs) <= 4e-7 * exp_probs + 1e-45))
        expect(close, f"{label}: probabilities differ by more than a few ulps")
    for t, d in enumerate(got["draws"]):
        expect(d["u"] == us[t], f"{label}: u at step {t}: {d['u']!r} != {us[t]!r}")
        tok, near = expected_token(ids, probs, us[t])
        if d["token"] != tok:
            if not exact and near < 1e-6:
                ambiguous += 1
                continue
            expect(False, f"{label}: step {t} token {d['token']} != expected {tok} (u={us[t]!r})")
        else:
            expect(True, "")


def main():
    data = rows()
    paths = {name: write_logits(name, v) for name, v in data.items()}
    temps = [0.3, 0.7, 1.0, 1.5]
    top_ps = [1.0, 0.95, 0.9, 0.5, 0.99999, 0.0]
    top_ks = [0, 1, 5, 50]
    n_cases = 0
    for name, logits in data.items():
        for T in temps:
            for top_p in top_ps:
                for top_k in top_ks:
                    if name == "wide" and top_k not in (0, 50):
                        continue
                    mode = "crn" if (n_cases % 2 == 0) else "seeded"
                    check_case(name, paths[name], logits, mode, T, top_p, top_k)
                    n_cases += 1

    # Exact probabilities (eight equal logits): top-p boundary ties and the strict inverse CDF.
    eq = paths["equal8"]
    d = atlas("--logits", eq, "--mode", "crn", "--tape-seed", 1, "--row-key", "k", "--top-p", "0.625")
    expect(d["survivors"] == [3, 4, 5, 6, 7], f"equal8 top_p=0.625: {d['survivors']}")  # 3/8 <= 0.375
    expect(d["probs"] == [float(np.float32(0.2))] * 5, f"equal8 renormalised: {d['probs']}")
    for u, tok in [(0.0, 0), (0.125, 1), (0.12499999999, 0), (0.5, 4), (0.875, 7), (0.99999999, 7)]:
        d = atlas("--logits", eq, "--mode", "seeded", "--seed", 1, "--u", repr(u))
        expect(d["draws"][0]["token"] == tok, f"equal8 u={u}: token {d['draws'][0]['token']} != {tok}")

    # Rounding shortfall: n equal logits whose n float32 probabilities float32(1/n) add up,
    # left to right in float32, to less than 1; a u above that total takes the last survivor.
    for n in range(3, 64):
        q, c = np.float32(1.0 / n), np.float32(0)
        for _ in range(n):
            c = np.float32(c + q)
        if float(c) < 1.0:
            break
    else:
        raise SystemExit("no shortfall row found")
    short = write_logits("short", np.zeros(n, dtype=np.float32))
    u = (float(c) + 1.0) / 2
    d = atlas("--logits", short, "--mode", "seeded", "--seed", 1, "--u", repr(u))
    expect(expected_token(list(range(n)), [q] * n, u)[0] == n - 1, "reference: shortfall takes the last")
    expect(d["draws"][0]["token"] == n - 1, f"shortfall n={n} u={u!r}: token {d['draws'][0]['token']} != {n - 1}")

    # CRN: two conditions (different distributions) on one tape share every u_t; another row
    # key does not.
    med = paths["medium"]
    a = atlas("--logits", med, "--mode", "crn", "--tape-seed", 42, "--row-key", "humaneval/3", "--steps", 32,
              "--temperature", "0.3", "--top-p", "0.95")
    b = atlas("--logits", paths["wide"], "--mode", "crn", "--tape-seed", 42, "--row-key", "humaneval/3", "--steps",
              32, "--temperature", "1.0", "--top-p", "0.5", "--top-k", "7")
    c = atlas("--logits", med, "--mode", "crn", "--tape-seed", 42, "--row-key", "humaneval/4", "--steps", 32,
              "--temperature", "0.3", "--top-p", "0.95")
    ua, ub, uc = ([x["u"] for x in r["draws"]] for r in (a, b, c))
    expect(ua == ub, "CRN: conditions sharing a tape and row key must share every u_t")
    expect(all(x != y for x, y in zip(ua, uc)), "CRN: another row key must give other u_t")
    expect(a["rng_state_sha256"] == b["rng_state_sha256"], "CRN: state hash is condition-free")

    # Seeded: same seed, same output bytes; different seeds differ.
    args = ["--logits", med, "--mode", "seeded", "--steps", 32, "--temperature", "1.0", "--top-p", "0.95"]
    r1 = subprocess.run([ATLAS, "sample-debug", *map(str, args), "--seed", "7"], capture_output=True)
    r2 = subprocess.run([ATLAS, "sample-debug", *map(str, args), "--seed", "7"], capture_output=True)
    expect(r1.returncode == 0 and r1.stdout == r2.stdout, "seeded: same seed must give identical output")
    s7 = [x["token"] for x in json.loads(r1.stdout)["draws"]]
    s8 = [x["token"] for x in atlas(*args, "--seed", 8)["draws"]]
    expect(s7 != s8, "seeded: different seeds should give different tokens")

    # Greedy: ties to the lower id.
    g = write_logits("greedy", [0.5, 3.0, -1.0, 3.0, 3.0])
    expect(atlas("--logits", g, "--mode", "greedy")["draws"][0]["token"] == 1, "greedy tie -> lower id")

    r = subprocess.run([ATLAS, "sample-debug", "--help"], capture_output=True, text=True)
    expect(r.returncode == 0 and "docs/decoding.md" in r.stdout, "sample-debug --help documents the tool")

    # Bad input: one clear error naming the file, non-zero exit, no output file.
    nan = os.path.join(tmp, "nan.json")
    with open(nan, "w") as f:
        f.write('[0.0, "nan", 1.0]')
    out = os.path.join(tmp, "out.json")
    r = atlas("--logits", nan, "--mode", "seeded", "--seed", 1, "--out", out, ok=False)
    expect(r.returncode != 0 and "nan.json" in r.stderr and "logits[1]" in r.stderr and not os.path.exists(out),
           f"NaN logit must fail naming file and index: {r.stderr!r}")
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write("[0.0, 1.0,")
    r = atlas("--logits", bad, "--mode", "greedy", ok=False)
    expect(r.returncode != 0 and "bad.json" in r.stderr, f"malformed JSON must fail naming the file: {r.stderr!r}")
    r = atlas("--logits", med, "--mode", "seeded", "--seed", 1, "--top-p", "1.5", ok=False)
    expect(r.returncode != 0 and "top_p" in r.stderr, f"top_p out of range must fail: {r.stderr!r}")

    print(f"{checks} checks over {n_cases} warper cases; {inexact_probs} cases with probabilities off by an ulp "
          f"(exp rounding); {ambiguous} ambiguous (within 1e-6 of a boundary)")
    if ambiguous > 0.02 * checks:
        failures.append(f"too many ambiguous cases: {ambiguous}")
    if failures:
        print(f"{len(failures)} FAILED")
        sys.exit(1)


main()
