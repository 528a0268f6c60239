#!/usr/bin/env python3
"""Normalizers on normalization-heavy strings: ids against the transformers.js oracle, offsets
against HF's alignment rules (tests/text/hf_alignment.py, independent of atlas's code).

Tokenizers written here: byte-level BPE over the 256 byte tokens with no merges, so every
normalized byte is one token and the offsets show where each normalized character came from,
with each normalizer of tokenizer.json in turn (NFC, NFD, NFKC, NFKD, Lowercase, Replace,
Prepend, Strip, and a Sequence). Strings: combining marks (stacked, reordered, blocked),
precomposed vs decomposed, full-width forms, ligatures, Hangul syllables and conjoining jamo,
half-width kana with voiced marks, compatibility characters, singletons, composition exclusions.

Required: offsets equal to HF's rules on every string; ids equal to the oracle's on every string
except the listed differences between transformers.js and HF (reasons in ORACLE_DIFFERENCES).
All cases go to BUILD/tokenizer_alignment_cases.json, which tools/reference/check_tokenizer_hf.py
checks against Python `tokenizers` on a machine that has it (HF is the reference).

The offset check runs without node; the oracle comparison is skipped (visibly) without it.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_alignment  # noqa: E402

SRC = os.environ.get("ATLAS_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("ATLAS_BIN", os.path.join(SRC, "build", "atlas"))
ORACLE = os.path.join(SRC, "tools", "oracle-js")

NORMALIZERS = {
    "nfc": {"type": "NFC"},
    "nfd": {"type": "NFD"},
    "nfkc": {"type": "NFKC"},
    "nfkd": {"type": "NFKD"},
    "lowercase": {"type": "Lowercase"},
    "nfkd_lowercase": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"}]},
    "replace_string": {"type": "Replace", "pattern": {"String": "  "}, "content": "\u2581"},
    "replace_regex": {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "<num>"},
    "prepend": {"type": "Prepend", "prepend": "\u2581"},
    "strip": {"type": "Strip", "strip_left": True, "strip_right": True},
    "nfc_strip": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip", "strip_left": True, "strip_right": True}]},
}

STRINGS = [
    # combining marks: composing, not composing, stacked, reordered (ccc 230 before 220), blocked
    "a\u0308\u0301", "e\u0301", "e\u0301\u0301", "o\u0302\u0323", "o\u0323\u0302", "q\u0307\u0323",
    "a\u0301\u0328", "A\u030A", "\u1EC7", "e\u0323\u0302", "\u0301abc", "x\u0338", "=\u0338",
    "Z\u0351\u0363a\u0364l\u0365", "\u05D0\u05B7\u05BC",
    # precomposed vs decomposed
    "caf\u00E9 cafe\u0301", "\u00C5ngstr\u00F6m \u212B \u2126", "\u01D5 U\u0308\u0304",
    # full-width forms, compatibility characters
    "\uFF21\uFF22\uFF23\u3000\uFF44\uFF45\uFF46\uFF01", "\uFF11\uFF12\uFF13", "\u2460\u2461 \u2162 \u00BD \u00B2",
    "\u338F \u2122 \u2026 \u00A0x", "\uFDFA", "\u3300",
    # ligatures
    "\uFB01nd \uFB02ow \uFB03x \uFB00", "\u0132 \u01C6 \u01C4",
    # Hangul: syllables and conjoining jamo (L V, L V T, LV + T)
    "\uD55C\uAD6D\uC5B4", "\u1112\u1161\u11AB\u1100\u116E\u11A8", "\u1100\u1161", "\uAC00\u11A8",
    "\u1100\u1161\u11A7",
    # half-width katakana with voiced marks (NFKC composes across the two characters)
    "\uFF76\uFF9E\uFF8A\uFF9F", "\u304B\u3099 \u30AB\u309A",
    # singletons and composition exclusions
    "\uF900 \u0958 \u2ADC",
    # case
    "\u0130stanbul \u0049\u0307", "\u1E9E \u00DF \u01C5", "\u039F\u0394\u03A5\u03A3\u03A3\u0395\u03A5\u03A3",
    # whitespace for Replace / Strip, digits for Replace
    "  a  b  ", "\u00E9  ", "  \u00E9", "x  y", "\t\u00E9\u3000", "a1b22c333", "\u0661\u0662 12",
    # mixed
    "na\u00EFve \uFB01anc\u00E9e \uD55C\uAE00 \uFF76\uFF9E 123", "",
]

# Where transformers.js is known to differ from HF; HF is right (check_tokenizer_hf.py checks).
ORACLE_DIFFERENCES = {
    "js_final_sigma": "JavaScript's toLowerCase maps a word-final capital sigma to final sigma (U+03C2); "
                      "HF lowercases character by character (U+03C3)",
    "js_trim": "JavaScript's trim() strips U+FEFF and not U+0085; "
               "HF strips Unicode White_Space (U+0085 included, U+FEFF not)",
}


def oracle_difference(name, text):
    norm = json.dumps(NORMALIZERS[name])
    if "Lowercase" in norm and "\u03A3" in text:
        return "js_final_sigma"
    if "Strip" in norm and ("\u0085" in text or "\uFEFF" in text):
        return "js_trim"
    return None


def byte_level_tokenizer(normalizer):
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    vocab, n = {}, 0
    for b in range(256):
        if b in keep:
            vocab[chr(b)] = b
        else:
            vocab[chr(256 + n)] = b
            n += 1
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": normalizer,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                                "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": []}}


def main():
    if not os.path.exists(BIN):
        print("atlas binary not found: " + BIN)
        return 1
    have_oracle = shutil.which("node") and os.path.isdir(os.path.join(ORACLE, "node_modules", "@lenml", "tokenizers"))
    tmp = tempfile.mkdtemp(prefix="atlas-toknorm-")
    failures = 0
    cases = []
    try:
        inp = os.path.join(tmp, "in.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for s in STRINGS:
                f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
        for name, norm in NORMALIZERS.items():
            d = os.path.join(tmp, name)
            os.mkdir(d)
            tj = byte_level_tokenizer(norm)
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(tj, f, ensure_ascii=False)
            r = subprocess.run([BIN, "tokenize", "--model", d, "--input", inp], capture_output=True, text=True)
            if r.returncode != 0:
                print("%s: atlas tokenize failed: %s" % (name, r.stderr[-2000:]))
                return 1
            got = [json.loads(l) for l in r.stdout.splitlines()]
            oracle = None
            if have_oracle:
                o = subprocess.run(["node", os.path.join(ORACLE, "oracle.mjs"), "encode", d, inp],
                                   capture_output=True, text=True, cwd=ORACLE)
                if o.returncode != 0:
                    print("%s: oracle failed: %s" % (name, o.stderr[-2000:]))
                    return 1
                oracle = [json.loads(l)["ids"] for l in o.stdout.splitlines()]
            texts = STRINGS
            if len(got) != len(texts) or (oracle is not None and len(oracle) != len(texts)):
                print("%s: line counts differ" % name)
                return 1
            n_off = n_ids = n_listed = 0
            for k, text in enumerate(texts):
                ids, offsets = got[k]["ids"], got[k]["offsets"]
                want = hf_alignment.expected_offsets(text, norm, [bytes([i]) for i in ids])
                if want != offsets:
                    n_off += 1
                    print("%s: offsets differ on %r\n  atlas %s\n  HF rules %s" % (name, text, offsets, want))
                case = {"tokenizer_json": tj, "label": name, "text": text, "add_special_tokens": False,
                        "atlas_ids": ids, "atlas_offsets": offsets}
                if oracle is not None:
                    case["oracle_ids"] = oracle[k]
                    if oracle[k] != ids:
                        reason = oracle_difference(name, text)
                        if reason:
                            n_listed += 1
                            case["reason"] = reason
                        else:
                            n_ids += 1
                            print("%s: ids differ from the oracle on %r\n  oracle %s\n  atlas  %s" % (
                                name, text, oracle[k], ids))
                cases.append(case)
            print("%-15s %d strings: offsets %d wrong; ids %s" % (
                name, len(texts), n_off,
                "not compared (no node oracle)" if oracle is None else
                "%d differ from the oracle, %d listed differences" % (n_ids, n_listed)))
            failures += n_off + n_ids
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for key, why in ORACLE_DIFFERENCES.items():
        print("listed difference %s: %s" % (key, why))
    out_dir = os.environ.get("ATLAS_BUILD_DIR") or tempfile.gettempdir()
    path = os.path.join(out_dir, "tokenizer_alignment_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    print("all %d cases written to %s (check with tools/reference/check_tokenizer_hf.py)" % (len(cases), path))
    if failures:
        print("FAILED: %d" % failures)
        return 1
    if not have_oracle:
        print("SKIP: offsets OK, but node / the npm oracle is absent: ids not compared")
        return 77
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
