"""tools/reference/exact_party.py: the exact-third-party verdict of fullsize_compare.py, on the
committed H200 record of session 4 (atlas bf16 closer to exact math than transformers bf16 at
every stage), on edited copies where it must turn false, on session 49's rerun (the verdict
the script wrote equals the recomputed one; the distances equal session 4's), and on session 69's
rerun on an H100 (atlas's own distances to exact math equal session 4's and 49's).
"""
import copy
import json
import os
import sys

SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
sys.path.insert(0, os.path.join(SRC, "tools", "reference"))
from exact_party import verdict_vs_exact  # noqa: E402

rec = json.load(open(os.path.join(SRC, "bench", "results", "h200-2026-11-30-s4-fullsize-compare.json")))
v = verdict_vs_exact(rec)
fails = []
if not (v["stages"] == 29 and v["stages_atlas_closer_or_equal"] == 29 and v["atlas_at_least_as_exact"]):
    fails.append("recorded run: %s" % v)
if not (abs(v["final_stage"]["atlas"] - 0.0438) < 5e-4 and abs(v["final_stage"]["hf_b1"] - 0.0446) < 5e-4):
    fails.append("final stage figures: %s" % v["final_stage"])

# One stage where atlas is farther from exact than transformers: the verdict turns false.
worse = copy.deepcopy(rec)
worse["stages_vs_atlas_f32"]["atlas_bf16"]["hidden.7"]["max"] = 1.0
w = verdict_vs_exact(worse)
if w["atlas_at_least_as_exact"] or w["stages_atlas_closer_or_equal"] != 28:
    fails.append("a worse stage was not caught: %s" % w)
# Routes that agree less with the exact ones on average: false as well.
routes = copy.deepcopy(rec)
for l in routes["route_set_agreement_vs_atlas_f32"]["atlas_bf16"]:
    routes["route_set_agreement_vs_atlas_f32"]["atlas_bf16"][l] -= 0.05
if verdict_vs_exact(routes)["atlas_at_least_as_exact"]:
    fails.append("worse routes were not caught")

# Session 49's rerun on the same prompts (6ed40f2): the verdict fullsize_compare.py wrote into the
# record is the one exact_party computes from it, and atlas bf16's distances to transformers equal
# session 4's at every stage (every kernel change since kept the bits).
rec49 = json.load(open(os.path.join(SRC, "bench", "results", "h200-2026-12-05-s49-fullsize-compare.json")))
def same(a, b):  # (a mean's last bit may differ: the device summed the agreements in another order)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return abs(a - b) <= 1e-12 * max(1.0, abs(a))
    return a == b


def written_verdict_is_recomputed(r, label):
    if not same(verdict_vs_exact(r), r["verdict"]["vs_exact"]):
        fails.append("%s record: written verdict %s, recomputed %s" % (label, r["verdict"]["vs_exact"], verdict_vs_exact(r)))


written_verdict_is_recomputed(rec49, "s49")
if rec49["stages"] != rec["stages"]:
    fails.append("s49 record: stage distances differ from session 4's")

# Session 69's rerun (c3a017d, on an H100, twenty sessions of kernel changes later): atlas bf16's
# distances and route agreements against atlas f32 (the exact third party) are session 4's and 49's
# to the last bit, whatever the GPU model. Transformers' own figures differ there (its cuBLAS picks
# other kernels on an H100), so only the atlas-only parts and the verdict's consistency are checked.
rec69 = json.load(open(os.path.join(SRC, "bench", "results", "h100-2026-12-07-s69-fullsize-compare.json")))
written_verdict_is_recomputed(rec69, "s69")
if not rec69["verdict"]["vs_exact"]["atlas_at_least_as_exact"]:
    fails.append("s69 record: atlas bf16 farther from exact math than transformers bf16")
for key in ("stages_vs_atlas_f32", "route_set_agreement_vs_atlas_f32"):
    for older, name in ((rec, "session 4"), (rec49, "session 49")):
        if rec69[key]["atlas_bf16"] != older[key]["atlas_bf16"]:
            fails.append("s69 record: %s of atlas bf16 differ from %s's" % (key, name))
if rec69["prompts"] != rec49["prompts"] or rec69["steps"] != rec49["steps"]:
    fails.append("s69 record: not the same prompts and steps as session 49's")

for f in fails:
    print("FAIL", f)
print("ok" if not fails else "%d failed" % len(fails))
sys.exit(1 if fails else 0)
