"""tools/profile/kernel_trace_summary.py on a synthetic kernel_trace file whose answers are known:
graph replays cut into steps at the argmax launch (warm-up steps skipped, non-graph launches
ignored), each step's wall time split over overlapping kernels and idle gaps so that the parts
add up to the step, and one layer's launches listed between two anchors, then with medians over every matching layer;
a step's head (the boundary from the step before and the first layer) and tail in the same form.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
TOOL = os.path.join(SRC, "tools", "profile", "kernel_trace_summary.py")
sys.path.insert(0, os.path.dirname(TOOL))
import kernel_trace_summary as kts  # noqa: E402

US = 1000  # the trace is in ns


def step_lines(t0):
    """One decode-like step starting at t0 (ns): two layers, then the argmax."""
    lines = []
    t = t0
    for _ in range(2):
        # A alone 5 us, A beside B 5 us (each gets half), B alone 5 us, idle 5 us, then the anchor.
        lines.append((t, t + 10 * US, "gemm_kernel", 616))
        lines.append((t + 5 * US, t + 15 * US, "side_kernel", 264))
        lines.append((t + 20 * US, t + 24 * US, "latent_cache_kernel", 1))
        t += 24 * US
    lines.append((t, t + 2 * US, "argmax_kernel", 1))
    return lines, t + 2 * US


def write_trace(path, steps):
    t = 1_000_000
    with open(path, "w") as f:
        f.write("%d %d 7 0 1 1 1 256 prefill_kernel\n" % (t - 500_000, t - 400_000))  # not a graph launch
        for _ in range(steps):
            lines, end = step_lines(t)
            for a, b, name, grid in lines:
                f.write("%d %d 7 3 %d 1 1 128 %s\n" % (a, b, grid, name))
            t = end + 50 * US  # host time between replays: not part of any step
        f.write("garbage line\n")


fails = []
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.txt")
    write_trace(path, 5)
    steps = kts.steps_of(kts.load(path), "argmax")
    if len(steps) != 5 or any(len(s) != 7 for s in steps):
        fails.append("steps: %s" % [len(s) for s in steps])
    share = kts.attribute(steps[0])
    want = {
        "gemm_kernel (616,1,1)x128": 2 * 7.5 * US,
        "side_kernel (264,1,1)x128": 2 * 7.5 * US,
        "latent_cache_kernel (1,1,1)x128": 2 * 4 * US,
        "argmax_kernel (1,1,1)x128": 2 * US,
        "(idle: no kernel running)": 2 * 5 * US,
    }
    for key, v in want.items():
        if abs(share.get(key, -1) - v) > 1e-6:
            fails.append("share of %s: %s, want %s" % (key, share.get(key), v))
    wall = steps[0][-1]["end"] - steps[0][0]["start"]
    if abs(sum(share.values()) - wall) > 1e-6 or wall != 50 * US:
        fails.append("parts %s do not add up to the step's wall %s" % (sum(share.values()), wall))

    out = subprocess.run([sys.executable, TOOL, path, "--skip", "2", "--layer", "0"], capture_output=True, text=True)
    if out.returncode != 0:
        fails.append("summary failed: %s" % out.stderr)
    text = out.stdout
    if "3 steps, 7 kernels each; wall per step: median 50.0 us" not in text:
        fails.append("header: %s" % text.splitlines()[:1])
    # The side kernel: 15 us of each 50 us step (its halves of the overlap and its lone 5 us
    # per layer), two launches of 10 us.
    if not any(l.split()[:5] == ["15.0", "30.0", "2", "10.00", "side_kernel"] for l in text.splitlines()):
        fails.append("side kernel row missing: %s" % text)
    layer = text.split("one step, kernels from latent_cache|gemm_mma_latent #0 to #1")[-1]
    layer = layer.split("the same kernels")[0].splitlines()
    rows = [l.split() for l in layer if "kernel (" in l]
    if [r[3] for r in rows] != ["latent_cache_kernel", "gemm_kernel", "side_kernel", "latent_cache_kernel"]:
        fails.append("layer listing: %s" % rows)
    elif rows[1][:3] != ["4.00", "14.00", "10.00"]:
        fails.append("offsets from the anchor: %s" % rows[1])
    # Per layer over every matching layer (one per step here, 3 steps): gemm ends 10 us after the
    # anchor, side 5 us after gemm, the next anchor 9 us after side; 24 us a layer.
    tail = text.split("the same kernels in every matching layer")[-1].split("the step's head:")[0]
    if "(3 layers of 3 steps): median layer 24.00 us" not in tail:
        fails.append("per-layer header: %s" % tail.splitlines()[:1])
    hop_rows = [l.split() for l in tail.splitlines()[2:] if "kernel (" in l]
    if [(r[0], r[3]) for r in hop_rows] != [("10.00", "gemm_kernel"), ("5.00", "side_kernel"),
                                            ("9.00", "latent_cache_kernel")]:
        fails.append("per-layer hops: %s" % hop_rows)

    # The step's ends: the head from the step before's argmax (it ended 50 us before this step
    # began: the host time between replays) to the second anchor, in two of the three steps (the
    # first listed has no step before it in the list); the tail from the last anchor.
    head = text.split("the step's head:")[-1].split("the step's tail:")[0]
    if "(2 of 2 steps alike): median 98.00 us" not in head:
        fails.append("head header: %s" % head.splitlines()[:1])
    head_rows = [l.split() for l in head.splitlines()[2:] if "kernel (" in l]
    if [r[0] for r in head_rows] != ["argmax_kernel", "60.00", "5.00", "9.00", "10.00", "5.00",
                                                           "9.00"]:
        fails.append("head hops: %s" % head_rows)
    tail_part = text.split("the step's tail:")[-1]
    tail_rows = [l.split() for l in tail_part.splitlines()[2:] if "kernel (" in l]
    if "(3 of 3 steps alike): median 2.00 us" not in tail_part or [r[0] for r in tail_rows] != [
            "latent_cache_kernel", "2.00"]:
        fails.append("tail: %s" % tail_part[:400])
    # Steps further apart than a run's replays have no head.
    heads, tails = kts.step_ends([steps[0], [dict(k, start=k["start"] + 10**9, end=k["end"] + 10**9)
                                             for k in steps[1]]], "latent_cache")
    if len(heads) != 0 or len(tails) != 2:
        fails.append("a step long after the one before should have no head: %d heads, %d tails" % (len(heads),
                                                                                                   len(tails)))

    # --origin: each kernel's start and end from the end of the layer's gemm kernel (the previous
    # layer's anchor ended 14 us before it ... the next one starts 10 us after it).
    out = subprocess.run([sys.executable, TOOL, path, "--skip", "2", "--layer", "0", "--origin", "gemm_kernel"],
                         capture_output=True, text=True)
    phase = out.stdout.split("each kernel's start and end from the end of the first 'gemm_kernel'")[-1]
    phase = phase.split("the step's head:")[0]
    phase_rows = [l.split()[:3] for l in phase.splitlines() if "kernel (" in l]
    if out.returncode != 0 or phase_rows != [["-14.00", "-10.00", "latent_cache_kernel"],
                                             ["-10.00", "0.00", "gemm_kernel"], ["-5.00", "5.00", "side_kernel"],
                                             ["10.00", "14.00", "latent_cache_kernel"]]:
        fails.append("phase listing: %s %s" % (phase_rows, out.stderr))
    out = subprocess.run([sys.executable, TOOL, path, "--skip", "2", "--layer", "0", "--origin", "no_such"],
                         capture_output=True, text=True)
    if out.returncode != 0 or "no phase listing: no kernel of the layer matches --origin 'no_such'" not in out.stdout:
        fails.append("a missing origin should be reported: %s" % out.stdout[-300:])

    # Anchor alternatives ('|'): any of them marks a layer's first kernel (the default's two names:
    # the latent cache kernel, or session 32's fused launch); one that matches nothing adds none.
    alt = subprocess.run([sys.executable, TOOL, path, "--skip", "2", "--layer", "0", "--anchor", "no_such|latent_cache"],
                         capture_output=True, text=True)
    if alt.returncode != 0 or alt.stdout.replace("no_such|latent_cache", "A") != text.replace(
            "latent_cache|gemm_mma_latent", "A"):
        fails.append("anchor alternatives should list the same layers: %s %s" % (alt.stdout[-300:], alt.stderr))

    # An anchor that matches too few kernels says so instead of printing nothing.
    out = subprocess.run([sys.executable, TOOL, path, "--skip", "2", "--anchor", "no_such_kernel"], capture_output=True,
                         text=True)
    if out.returncode != 0 or "no layer listing: 0 kernels per step match --anchor 'no_such_kernel'" not in out.stdout:
        fails.append("a missing anchor should be reported: %s %s" % (out.stdout[-300:], out.stderr))

    empty = os.path.join(d, "empty.txt")
    open(empty, "w").write("1 2 7 0 1 1 1 32 not_a_graph_kernel\n")
    out = subprocess.run([sys.executable, TOOL, empty], capture_output=True, text=True)
    if out.returncode == 0 or "no graph steps" not in out.stderr:
        fails.append("a trace without graph replays should fail with a message: %s" % out.stderr)

    bad = os.path.join(d, "bad.txt")
    open(bad, "w").write("1 2 7 3 1 1 1 32 ok_kernel\n1 x 7 3 1 1 1 32 broken_kernel\n")
    out = subprocess.run([sys.executable, TOOL, bad], capture_output=True, text=True)
    if out.returncode == 0 or bad + ":2:" not in out.stderr or "Traceback" in out.stderr:
        fails.append("a non-number field should fail naming the file and line: %s" % out.stderr)
    out = subprocess.run([sys.executable, TOOL, os.path.join(d, "missing.txt")], capture_output=True, text=True)
    if out.returncode == 0 or "cannot read" not in out.stderr or "Traceback" in out.stderr:
        fails.append("a missing file should fail with one clear line: %s" % out.stderr)

if fails:
    print("\n".join(fails))
    sys.exit(1)
print("kernel_trace_summary: steps, wall split, layer, phase and step-end listings as expected")
