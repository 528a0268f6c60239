#!/usr/bin/env python3
"""Where the wall time of replayed CUDA graphs goes, from a kernel_trace.cpp file.

Graph replays (kernels with a graph id) are cut into steps after each kernel whose name holds
--step-end (default: argmax, the last launch of a greedy decode step). Each step's wall time is
split over the kernels running at each instant (an instant with two kernels gives each half)
and the idle gaps, so the figures of a step add up to its wall time; per-kernel durations are
given beside that. --layer prints one step's kernels between two occurrences of --anchor
(substrings separated by '|', any of which marks a kernel; default latent_cache|gemm_mma_latent:
the latent-cache kernels, or since session 32 the launch that runs the latent cache job beside
the absorbed query, one per layer), in
start order, with offsets. Then the same layer's kernels with medians over every layer of every
step whose launches match it (the same kernels in the same start order): each kernel's end minus
the latest earlier end among the layer's kernels (the first anchor included), so one sampled
layer's noise does not make the figures; the column adds up to the layer's time in each layer
(its medians need not add up exactly). With --origin, last, each of those kernels' start and end
relative to the end of the layer's first kernel whose name holds --origin (medians over the same
layers): when each phase of a layer begins and ends, side-stream kernels included (session 28
read the MoE part this way, from the post-attention norm: --origin rmsnorm_wide). Last, a step's
two ends in the same 'after' form, medians over the steps alike: its head (the step before's last
kernel, then the kernels up to the step's second anchor: the step boundary and the first layer,
V2-Lite's dense one; only steps that began within 100 us of the step before) and its tail (the
last anchor to the argmax: the last layer, the final norm and the LM head).

  python3 tools/profile/kernel_trace_summary.py /tmp/k.txt [--skip 3] [--layer 10] [--origin NAME]
"""
import argparse
import collections
import statistics
import sys


def load(path):
    """The trace's kernels; lines with fewer than 9 fields are passed over, a field that should be
    a number and is not ends the run with the file and line named."""
    ks = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"kernel_trace_summary: cannot read {path}: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if len(p) < 9:
                continue
            try:
                start, end, stream, graph = int(p[0]), int(p[1]), int(p[2]), int(p[3])
                int(p[4]), int(p[5]), int(p[6]), int(p[7])
            except ValueError:
                sys.exit(f"kernel_trace_summary: {path}:{n}: expected 'start end stream graph gx gy gz block name', "
                         f"got {line.strip()!r}")
            ks.append(dict(start=start, end=end, stream=stream, graph=graph,
                           key=f"{p[8]} ({p[4]},{p[5]},{p[6]})x{p[7]}"))
    return ks


def steps_of(ks, step_end):
    g = sorted((k for k in ks if k["graph"] != 0), key=lambda k: k["start"])
    steps, cur = [], []
    for k in g:
        cur.append(k)
        if step_end in k["key"]:
            steps.append(cur)
            cur = []
    return steps


def attribute(step):
    """Wall time of the step split over running kernels and idle gaps (sweep line)."""
    ev = []
    for i, k in enumerate(step):
        ev.append((k["start"], 1, i))
        ev.append((k["end"], -1, i))
    ev.sort()
    share = collections.Counter()
    running = set()
    last = ev[0][0]
    for t, kind, i in ev:
        if t > last:
            if running:
                for j in running:
                    share[step[j]["key"]] += (t - last) / len(running)
            else:
                share["(idle: no kernel running)"] += t - last
            last = t
        if kind == 1:
            running.add(i)
        else:
            running.discard(i)
    return share


def is_anchor(key, anchor):
    """Whether a kernel's key holds one of the anchor's '|'-separated substrings."""
    return any(part in key for part in anchor.split("|") if part)


def layers(steps, anchor, ref_keys):
    """Every layer (kernels from one anchor to the next, start order) whose keys equal ref_keys."""
    for st in steps:
        idx = [i for i, k in enumerate(st) if is_anchor(k["key"], anchor)]
        for lo, hi in zip(idx, idx[1:]):
            ks = st[lo:hi + 1]
            if [k["key"] for k in ks] == ref_keys:
                yield ks


def segment_hops(segments):
    """For every segment (a list of kernels): per position j >= 1, the kernel's end minus the latest
    end before it among the segment's kernels (0 where none is earlier); and the segment's span,
    last end minus first end."""
    gaps = collections.defaultdict(list)
    spans = []
    for ks in segments:
        ends = [k["end"] for k in ks]
        for j in range(1, len(ks)):
            earlier = [e for e in ends if e < ks[j]["end"]]
            gaps[j].append(ks[j]["end"] - max(earlier) if earlier else 0)
        spans.append(ks[-1]["end"] - ks[0]["end"])
    return gaps, spans


def hops(steps, anchor, ref_keys):
    """segment_hops over every layer whose keys equal ref_keys (the span: last anchor end minus
    first anchor end)."""
    return segment_hops(layers(steps, anchor, ref_keys))


# A step's head counts only where the step began within this of the step before's last kernel's
# end (ns): the next step of the same run, not the first step after a prefill or another run.
HEAD_GAP_NS = 100_000


def step_ends(steps, anchor):
    """The kernels at a step's two ends, per step: the head (the step before's last kernel, then the
    step's kernels up to its second anchor: the step boundary and the first layer) and the tail
    (from the step's last anchor to its end: the last layer, the final norm, the head, the argmax).
    Lists of segments; a step without two anchors has neither."""
    heads, tails = [], []
    for i, st in enumerate(steps):
        idx = [j for j, k in enumerate(st) if is_anchor(k["key"], anchor)]
        if len(idx) < 2:
            continue
        tails.append(st[idx[-1]:])
        if i > 0 and st[0]["start"] - steps[i - 1][-1]["end"] < HEAD_GAP_NS:
            heads.append([steps[i - 1][-1]] + st[:idx[1] + 1])
    return heads, tails


def print_segments(title, segments):
    """The segments whose keys equal the middle one's: each kernel's 'after' (median, min, max)."""
    if not segments:
        print(f"\n{title}: none")
        return
    ref = segments[len(segments) // 2]
    keys = [k["key"] for k in ref]
    same = [sg for sg in segments if [k["key"] for k in sg] == keys]
    gaps, spans = segment_hops(same)
    print(f"\n{title} ({len(same)} of {len(segments)} steps alike): median {statistics.median(spans) / 1e3:.2f} us "
          f"from its first kernel's end to its last's; per kernel, its end minus the latest earlier end among "
          f"these kernels (median, min, max)")
    print(f"{'after':>8} {'min':>7} {'max':>7}  kernel")
    print(f"{'':>8} {'':>7} {'':>7}  {keys[0]}")
    for j in range(1, len(keys)):
        g = gaps[j]
        print(f"{statistics.median(g) / 1e3:8.2f} {min(g) / 1e3:7.2f} {max(g) / 1e3:7.2f}  {keys[j]}")


def phases(steps, anchor, ref_keys, origin):
    """For every layer as in hops() whose keys equal ref_keys: per position j, (start - t0, end - t0)
    where t0 is the end of the layer's first kernel whose key holds origin (None if none does)."""
    pos = next((j for j, k in enumerate(ref_keys) if origin in k), None)
    if pos is None:
        return None
    rows = collections.defaultdict(list)
    for ks in layers(steps, anchor, ref_keys):
        t0 = ks[pos]["end"]
        for j, k in enumerate(ks):
            rows[j].append((k["start"] - t0, k["end"] - t0))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--step-end", default="argmax")
    ap.add_argument("--skip", type=int, default=2, help="steps to pass over first (graph upload, warm-up)")
    ap.add_argument("--layer", type=int, default=10)
    # Any kernel whose key contains it (the latent-cache kernel has two variants since session 15).
    ap.add_argument("--anchor", default="latent_cache|gemm_mma_latent")
    ap.add_argument("--origin", default=None, help="also list the layer's kernels from this kernel's end")
    a = ap.parse_args()
    steps = steps_of(load(a.trace), a.step_end)[a.skip:]
    if not steps:
        sys.exit("no graph steps in " + a.trace)
    walls = [s[-1]["end"] - s[0]["start"] for s in steps]
    print(f"{len(steps)} steps, {len(steps[0])} kernels each; wall per step: median "
          f"{statistics.median(walls) / 1e3:.1f} us (min {min(walls) / 1e3:.1f}, max {max(walls) / 1e3:.1f})")
    shares = collections.Counter()
    durs = collections.defaultdict(list)
    for s in steps:
        shares.update(attribute(s))
        for k in s:
            durs[k["key"]].append(k["end"] - k["start"])
    n = len(steps)
    total = sum(shares.values()) / n
    print(f"\n{'wall us/step':>12} {'%':>5} {'calls':>5} {'us/call':>8}  kernel (grid)xblock")
    for key, v in shares.most_common():
        d = durs.get(key, [])
        calls = len(d) / n
        per = statistics.median(d) / 1e3 if d else 0.0
        print(f"{v / n / 1e3:12.1f} {100 * v / n / total:5.1f} {calls:5.0f} {per:8.2f}  {key}")
    s = steps[len(steps) // 2]
    idx = [i for i, k in enumerate(s) if is_anchor(k["key"], a.anchor)]
    if len(idx) > a.layer + 1:
        lo, hi = idx[a.layer], idx[a.layer + 1]
        t0 = s[lo]["start"]
        print(f"\none step, kernels from {a.anchor} #{a.layer} to #{a.layer + 1} (start order; us from the first)")
        print(f"{'start':>8} {'end':>8} {'dur':>7}  kernel")
        for k in s[lo:hi + 1]:
            print(f"{(k['start'] - t0) / 1e3:8.2f} {(k['end'] - t0) / 1e3:8.2f} {(k['end'] - k['start']) / 1e3:7.2f}  {k['key']}")
        ref = s[lo:hi + 1]
        gaps, spans = hops(steps, a.anchor, [k["key"] for k in ref])
        print(f"\nthe same kernels in every matching layer ({len(spans)} layers of {len(steps)} steps): median layer "
              f"{statistics.median(spans) / 1e3:.2f} us ({a.anchor} end to the next one's end); per kernel, its end "
              f"minus the latest earlier end in its layer (median, min, max)")
        print(f"{'after':>8} {'min':>7} {'max':>7}  kernel")
        for j in range(1, len(ref)):
            g = gaps[j]
            print(f"{statistics.median(g) / 1e3:8.2f} {min(g) / 1e3:7.2f} {max(g) / 1e3:7.2f}  {ref[j]['key']}")
        if a.origin is not None:
            rows = phases(steps, a.anchor, [k["key"] for k in ref], a.origin)
            if rows is None:
                print(f"\nno phase listing: no kernel of the layer matches --origin {a.origin!r}")
            else:
                print(f"\nthe same layers, each kernel's start and end from the end of the first {a.origin!r} "
                      f"(us, medians)")
                print(f"{'start':>8} {'end':>8}  kernel")
                for j in range(len(ref)):
                    st = statistics.median(r[0] for r in rows[j]) / 1e3
                    en = statistics.median(r[1] for r in rows[j]) / 1e3
                    print(f"{st:8.2f} {en:8.2f}  {ref[j]['key']}")
    else:
        print(f"\nno layer listing: {len(idx)} kernels per step match --anchor {a.anchor!r}, --layer {a.layer} needs "
              f"{a.layer + 2}")
    heads, tails = step_ends(steps, a.anchor)
    print_segments("the step's head: the step before's last kernel, then this step's up to its second anchor", heads)
    print_segments("the step's tail: from its last anchor to its end", tails)


if __name__ == "__main__":
    main()
