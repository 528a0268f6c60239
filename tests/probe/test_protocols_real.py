"""The seed protocols against the real DeepSeek-V2-Lite(-Chat) tokenizer, for a user who has it:
set ATLAS_DEEPSEEK_DIR to a directory with its tokenizer.json and tokenizer_config.json (weights
are not needed). Checks the token ids the seeds pin (section 2.2): x 87, . 13, User 5726,
Assistant 77398, BOS 100000, EOS 100001, and the full-size cell counts. Skips (77) otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

ATLAS = os.environ.get("ATLAS_BIN", "build/atlas")
SRC = os.environ.get("ATLAS_SOURCE_DIR", ".")
MODEL = os.environ.get("ATLAS_DEEPSEEK_DIR", "")
DATA = os.path.normpath(os.path.join(SRC, "..", "shared", "data"))
if not MODEL or not os.path.isfile(os.path.join(MODEL, "tokenizer.json")) or not os.path.isdir(DATA):
    print("skip: set ATLAS_DEEPSEEK_DIR to a DeepSeek-V2-Lite tokenizer directory (and have ../shared/data)")
    sys.exit(77)

failures = []
with tempfile.TemporaryDirectory() as tmp:
    for f, cells in (("09_special_token_family.toml", 1024), ("10_role_marker_block.toml", 1024),
                     ("08_role_marker_head.toml", 1024), ("11_chat_generation.toml", 128)):
        out = os.path.join(tmp, f + ".json")
        p = subprocess.run([ATLAS, "freeze", os.path.join(SRC, "protocols", f), "--model", MODEL, "--data", DATA,
                            "--out", out], capture_output=True, text=True)
        if p.returncode:
            failures.append(f"{f}: {p.stderr.strip()}")
            continue
        m = json.load(open(out))
        if len(m["cells"]) != cells:
            failures.append(f"{f}: {len(m['cells'])} cells, the seed has {cells}")
        if (m["tokenizer"]["bos_id"], m["tokenizer"]["eos_id"]) != (100000, 100001):
            failures.append(f"{f}: BOS/EOS {m['tokenizer']['bos_id']}/{m['tokenizer']['eos_id']}")
        for k, v in (("x", 87), (".", 13)):
            if k in m["edit_ids"] and m["edit_ids"][k] != v:
                failures.append(f"{f}: {k!r} -> {m['edit_ids'][k]}, the seed pins {v}")
        for c in m["cells"]:
            ids = c["input_ids"]
            a = c["anchors"]
            if "target_role_head" in a and c["edits"] == [] and ids[a["target_role_head"]] != 5726:
                failures.append(f"{f}: {c['cell_id']} role head {ids[a['target_role_head']]} (seed: User 5726)")
                break
            if "gen_role_head" in a and c["edits"] == [] and ids[a["gen_role_head"]] != 77398:
                failures.append(f"{f}: {c['cell_id']} generation head {ids[a['gen_role_head']]} (seed: Assistant 77398)")
                break
        print(f"{f}: {len(m['cells'])} cells")
for x in failures:
    print("FAIL", x)
sys.exit(1 if failures else 0)
