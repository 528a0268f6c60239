#!/usr/bin/env python3
"""transformers' figures for `atlas bench` (issue 5), on the same machine, checkpoint and prompts.

    atlas bench --model DIR --save-prompts P.json            # the prompts atlas will run
    python3 tools/reference/bench_transformers.py --model DIR --prompts P.json --out REF.json
    atlas bench --model DIR --reference REF.json --json bench.json

The model is transformers' native DeepseekV2ForCausalLM in bf16 on one GPU with the router patched
to the official semantics (make_fixtures.load_patched: normalised top-k weights when norm_topk_prob,
official softmax scale and YaRN tables). Attention: sdpa (transformers' fastest built-in path
for this model; eager with --attn eager). Workloads, as atlas bench defines them:
  load                 s      from_pretrained to the GPU, files already in the page cache
  seed-grid-128x512    s      model.generate, greedy, left-padded batch of all prompts, EOS off
                              (min_new_tokens = max_new_tokens)
  prefill-trace-128    s      one forward over the padded batch with hidden states of every layer
                              and the routes recorded, each row's stages hashed (SHA-256) on the host
  decode-b1            tok/s  one prompt, greedy generate of N+1 tokens minus one prefill, per token
  peak-mem-128x1024    GiB    torch.cuda.max_memory_reserved + the CUDA context (device memory used
                              before loading), during prefill of the memory prompts + the decode steps
--grid-new-tokens lowers the grid's length (the value measured is written in the record, never scaled).
"""
import argparse
import datetime
import hashlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as MF  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def left_pad(rows, pad_id=0):
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = torch.tensor(r)
        mask[i, T - len(r):] = 1
    return ids, mask


def sync():
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--workload", action="append", default=None)
    ap.add_argument("--grid-new-tokens", type=int, default=None)
    ap.add_argument("--decode-steps", type=int, default=None)
    args = ap.parse_args()
    P = json.load(open(args.prompts))
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    wl = args.workload or ["load", "seed-grid-128x512", "prefill-trace-128", "decode-b1", "peak-mem-128x1024"]
    import transformers
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as M
    records, notes = [], {}

    # page cache first, as atlas does
    for f in sorted(os.listdir(args.model)):
        if f.endswith(".safetensors"):
            with open(os.path.join(args.model, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info()
    context_bytes = total - free0
    patches, rec = [], MF.Recorder()
    t0 = time.perf_counter()
    model = MF.load_patched(M, args.model, cfg, None, torch.bfloat16, patches, notes, rec, attn=args.attn,
                            device="cuda")
    sync()
    load_s = time.perf_counter() - t0
    model.generation_config.eos_token_id = None
    if "load" in wl:
        records.append({"workload": "load", "value": load_s, "unit": "s"})
    log("load %.1f s" % load_s)

    if "seed-grid-128x512" in wl:
        n = args.grid_new_tokens or P["new_tokens"]
        ids, mask = left_pad(P["prompts"])
        ids, mask = ids.cuda(), mask.cuda()
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        sync()
        s = time.perf_counter() - t0
        new = out[:, ids.shape[1]:]
        records.append({"workload": "seed-grid-128x512", "value": s, "unit": "s", "new_tokens_per_row": n,
                        "rows": len(P["prompts"]), "tokens_per_s": new.numel() / s,
                        "note": "measured at %d new tokens per row" % n})
        log("grid %d x %d: %.1f s" % (len(P["prompts"]), n, s))

    if "prefill-trace-128" in wl:
        ids, mask = left_pad(P["prompts"])
        ids, mask = ids.cuda(), mask.cuda()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        sync()
        t0 = time.perf_counter()
        rec.t, rec.on = {}, True
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                        output_hidden_states=True, logits_to_keep=1)
        rec.on = False
        hs = [h.float().cpu() for h in out.hidden_states]
        routes = {k: v.cpu() for k, v in rec.t.items() if "topk" in k}
        digest = hashlib.sha256()
        for h in hs:
            for b, r in enumerate(P["prompts"]):
                digest.update(hashlib.sha256(h[b, h.shape[1] - len(r):].numpy().tobytes()).digest())
        sync()
        s = time.perf_counter() - t0
        records.append({"workload": "prefill-trace-128", "value": s, "unit": "s", "stages": len(hs),
                        "gates": len(routes) // 2})
        log("prefill trace: %.2f s" % s)

    if "decode-b1" in wl:
        steps = args.decode_steps or P["decode_steps"]
        ids = torch.tensor([P["decode_prompt"]], device="cuda")
        with torch.no_grad():
            model(input_ids=ids)  # warm-up
            sync()
            t0 = time.perf_counter()
            model(input_ids=ids, logits_to_keep=1)
            sync()
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(input_ids=ids, max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
            sync()
            s = time.perf_counter() - t0 - prefill
        records.append({"workload": "decode-b1", "value": steps / s, "unit": "tok/s", "steps": steps})
        log("decode b1: %.1f tok/s" % (steps / s))

    if "peak-mem-128x1024" in wl:
        m = P["mem"]
        ids = torch.tensor(P["mem_prompts"], device="cuda")
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=m["steps"],
                           min_new_tokens=m["steps"], do_sample=False, eos_token_id=None, pad_token_id=0)
        sync()
        peak = torch.cuda.max_memory_reserved() + context_bytes
        records.append({"workload": "peak-mem-128x1024", "value": peak / 2**30, "unit": "GiB",
                        "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30})
        log("peak mem %.1f GiB" % (peak / 2**30))

    res = {"reference": "transformers %s DeepseekV2ForCausalLM (%s attention, bf16), official router patch" %
                        (transformers.__version__, args.attn),
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "patches": patches,
           # When it ran (UTC): atlas bench copies it into every record's reference_source, so a
           # comparison with another session's run is visible as such.
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "records": records}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=2)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
