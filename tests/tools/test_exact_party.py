"""tools/reference/exact_party.py: the exact-third-party verdict of fullsize_compare.py, on the
committed H200 record of session 4 (atlas bf16 closer to exact math than transformers bf16 at
every stage) and on edited copies where it must turn false.
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

for f in fails:
    print("FAIL", f)
print("ok" if not fails else "%d failed" % len(fails))
sys.exit(1 if fails else 0)
