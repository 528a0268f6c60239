"""Every seed protocol in protocols/ freezes against the tiny checkpoint's tokenizer (+ real
corpora, 2 sources per domain instead of 32) and keeps the seed's structural contracts
(seed-system.md section 3): cells = sources x content lengths x seeds x conditions, the number
of edited ids per condition, equal length and position within each system level, one edit at
the declared anchor. Skips (77) when ../shared/data is absent.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ATLAS = os.environ.get("ATLAS_BIN", "build/atlas")
SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
DATA = os.path.normpath(os.path.join(SRC, "..", "shared", "data"))
if not os.path.isdir(DATA):
    DATA = "/work/shared/data"
if not os.path.isdir(DATA):
    print("skip: shared data absent")
    sys.exit(77)

PER = 2
SPECIAL = {"eos": 0, "bos": 1, "x": 1, "period": 1}
# protocol file -> (domains, content lengths, seeds [(value, sources_per_domain)], {condition: edits}, per_domain override)
def sys2(d):
    return {f"s{s}_{k}": v for s in (0, 1) for k, v in d.items()}

EXPECT = {
    "01_truncated_trace.toml": dict(domains=1, per=4, lengths=1, seeds=[], cond={"raw": 0}),
    "02_routing_corpus.toml": dict(domains=4, lengths=1, seeds=[], cond={"raw": 0}),
    "03_length_control.toml": dict(domains=4, lengths=2, seeds=[], cond={"raw": 0}),
    "04_chat_template.toml": dict(domains=4, lengths=1, seeds=[], cond={"raw": 0, "user": 0, "generation": 0}),
    "05_system_oneshot_factorial.toml": dict(domains=4, lengths=1, seeds=[], cond={"S0F0": 0, "S1F0": 0, "S0F1": 0, "S1F1": 0}),
    "06_filler_history.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2({"none": 0, "filler": 0, "oneshot": 0})),
    "07_history_boundary.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2({"eos": 0, "x": 1, "period": 1, "newline": 1})),
    "08_role_marker_head.toml": dict(domains=4, lengths=1, seeds=[],
                                     cond=sys2({"official": 0, "user_to_assistant": 1, "user_to_x": 1, "post_assistant_to_user": 1})),
    "09_special_token_family.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2(SPECIAL)),
    "10_role_marker_block.toml": dict(domains=4, lengths=1, seeds=[],
                                      cond=sys2({"user_colon": 0, "assistant_colon": 1, "user_x": 1, "assistant_x": 2})),
    "11_chat_generation.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2(SPECIAL), mode="generate", max_new=128),
    "12_completion_512.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2(SPECIAL), mode="generate", max_new=512),
    "13_full_depth_trace.toml": dict(domains=4, lengths=1, seeds=[], cond=sys2(SPECIAL)),
    "14_multi_seed_sampling.toml": dict(domains=4, per=1, lengths=1, seeds=[0] * 8, cond=sys2(SPECIAL), mode="generate", max_new=512),
    "15_cross_source_sampling.toml": dict(domains=4, lengths=1, seeds=[0] * 4, cond=sys2({"eos": 0, "period": 1}), mode="generate", max_new=512),
    "16_task_bootstrap_crn.toml": dict(domains=2, lengths=1, seeds=[0, 4, 4, 4], cond=sys2({"eos": 0, "period": 1}), mode="generate", max_new=512),
}
# The seed's own cell counts at full size (per_domain as in the protocol), for the record:
# 3.7-3.10: 128 sources x 8 = 1024 cells (256 official, 768 one-edit; 3.10: 256/512/256);
# 3.11: 16 x 8 = 128; 3.14: 4 x 8 x 8 = 256; 3.15: 16 x 4 x 4 = 256; 3.16: 64 x 4 + 8 x 3 x 4 = 352.
FULL = {"09_special_token_family.toml": 1024, "10_role_marker_block.toml": 1024, "11_chat_generation.toml": 128,
        "14_multi_seed_sampling.toml": 256, "15_cross_source_sampling.toml": 256, "16_task_bootstrap_crn.toml": 352}

# Declared analysis designs (docs/probe.md): edges and factorials per protocol, as the seeds
# describe them (3.5: four factor edges and the 2x2; 3.11/3.13: ten edges; ...); absent = none.
DESIGN = {"04_chat_template.toml": (3, 0), "05_system_oneshot_factorial.toml": (4, 1), "06_filler_history.toml": (7, 2),
          "07_history_boundary.toml": (10, 3), "08_role_marker_head.toml": (10, 3), "09_special_token_family.toml": (10, 3),
          "10_role_marker_block.toml": (12, 2), "11_chat_generation.toml": (10, 0), "12_completion_512.toml": (10, 0),
          "13_full_depth_trace.toml": (10, 3), "14_multi_seed_sampling.toml": (10, 0), "15_cross_source_sampling.toml": (4, 0),
          "16_task_bootstrap_crn.toml": (4, 0)}

os.environ["OMP_NUM_THREADS"] = "1"
tmp = tempfile.mkdtemp(prefix="atlas-protocols-")
failures = []
try:
    tiny = os.path.join(tmp, "tiny")
    subprocess.run([ATLAS, "make-model", "--preset", "tiny", tiny], check=True, capture_output=True)
    # The tiny checkpoint's tokenizer files alone: the protocols' layer ranges are the real model's
    # (e.g. 0-6), which freezing checks against a directory's config.json where there is one (the
    # tiny model has 4 layers); without one, nothing but the tokenizer is read.
    model = os.path.join(tmp, "tokenizer-only")
    os.makedirs(model)
    for name in os.listdir(tiny):
        if name.startswith("tokenizer"):
            shutil.copy(os.path.join(tiny, name), model)
    pdir = os.path.join(SRC, "protocols")
    files = sorted(f for f in os.listdir(pdir) if f.endswith(".toml"))
    assert files == sorted(EXPECT), f"protocols/ holds {files}"
    for f in files:
        e = EXPECT[f]
        per = e.get("per", PER)
        out = os.path.join(tmp, f + ".json")
        p = subprocess.run([ATLAS, "freeze", os.path.join(pdir, f), "--model", model, "--data", DATA, "--out", out,
                            "--per-domain", str(per)], capture_output=True, text=True)
        if p.returncode != 0:
            failures.append(f"{f}: freeze failed: {p.stderr.strip()}")
            continue
        m = json.load(open(out))
        cells = m["cells"]
        n_src = e["domains"] * per
        seed_rows = sum(min(k, per) if k else per for k in e["seeds"]) * e["domains"] if e["seeds"] else n_src
        want = seed_rows * e["lengths"] * len(e["cond"])
        if len(cells) != want:
            failures.append(f"{f}: {len(cells)} cells, want {want}")
        got_conds = list(dict.fromkeys(c["condition"] for c in cells))
        if got_conds != list(e["cond"]):
            failures.append(f"{f}: conditions {got_conds}, want {list(e['cond'])}")
        for c in cells:
            if len(c["edits"]) != e["cond"].get(c["condition"], -1):
                failures.append(f"{f}: {c['cell_id']} has {len(c['edits'])} edits")
                break
        # Groups (system levels): equal length and target position per source.
        groups = {}
        for c in cells:
            if c["group"]:
                groups.setdefault((c["source_key"], c["content_tokens"], c["seed"], c["group"]), set()).add(
                    (c["n_tokens"], c["interior_token_range"][0]))
        if any(len(v) != 1 for v in groups.values()):
            failures.append(f"{f}: a group with unequal length or position")
        ex = m["protocol"]["execution"]
        if ex["mode"] != e.get("mode", "trace"):
            failures.append(f"{f}: mode {ex['mode']}")
        if "max_new" in e and ex["max_new_tokens"] != e["max_new"]:
            failures.append(f"{f}: max_new_tokens {ex['max_new_tokens']}")
        # Full-size cell counts follow from the protocol's own per_domain.
        if f in FULL:
            import tomllib
            with open(os.path.join(pdir, f), "rb") as fh:
                full_per = tomllib.load(fh)["selection"]["per_domain"]
            full_rows = (sum(min(k, full_per) if k else full_per for k in e["seeds"]) if e["seeds"] else full_per) * e["domains"]
            if full_rows * e["lengths"] * len(e["cond"]) != FULL[f]:
                failures.append(f"{f}: at full size {full_rows * len(e['cond'])} cells, the seed has {FULL[f]}")
        # The declared design is carried into the manifest (only when declared).
        n_e, n_f = DESIGN.get(f, (0, 0))
        pj = m["protocol"]
        if len(pj.get("edges", [])) != n_e or len(pj.get("factorials", [])) != n_f or ("edges" in pj) != (n_e > 0):
            failures.append(f"{f}: design {len(pj.get('edges', []))} edges, {len(pj.get('factorials', []))} factorials")
        conds = set(e["cond"])
        for ed in pj.get("edges", []):
            if ed["condition"] not in conds or ed["reference"] not in conds or ed["condition"] == ed["reference"]:
                failures.append(f"{f}: edge {ed}")
        for fc in pj.get("factorials", []):
            four = [fc[k] for k in ("a0b0", "a1b0", "a0b1", "a1b1")]
            if len(set(four)) != 4 or not set(four) <= conds:
                failures.append(f"{f}: factorial {fc}")
        # Edits at the history boundary replace the assistant EOS.
        eos = m["tokenizer"]["eos_id"]
        for c in cells:
            for ed in c["edits"]:
                if ed["anchor"] == "history_eos" and ed["official_id"] != eos:
                    failures.append(f"{f}: {c['cell_id']} history_eos edit of id {ed['official_id']}")
        print(f"{f}: {len(cells)} cells ok")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

for x in failures:
    print("FAIL", x)
sys.exit(1 if failures else 0)
