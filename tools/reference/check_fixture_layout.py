#!/usr/bin/python3
"""Check the layout of the committed reference fixtures without torch (numpy only).

    /usr/bin/python3 tools/reference/check_fixture_layout.py [tests/fixtures]

For every tests/fixtures/<name>/ it checks:
  * checkpoint: config.json fields; every tensor the config implies (spec section 2 names and
    shapes) is present with the stored dtype, nothing else; shard index agrees with the shards.
  * reference.safetensors / reference_bf16.safetensors: exactly the `atlas trace --dump` names with
    a leading batch dim, shapes and dtypes as documented in tools/reference/README.md.
  * inputs: left padded with pad = eos, row 0 unpadded and the longest, rows of different lengths.
  * router tensors: ids in range, distinct per token, ordered by weight descending (ties: lower id);
    weights sum to 1 when norm_topk_prob (top_k > 1), else equal softmax(logits)[ids] * scaling.
  * generate.json: the case structure, prompt prefix preserved, new tokens within vocab.
  * total size under 5 MB.
Exit 0 when all pass, 1 with one line per problem otherwise.
"""

import json
import os
import struct
import sys

import numpy as np

DT = {"F32": (np.float32, 4), "I32": (np.int32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}
problems = []


def fail(where, what):
    problems.append("%s: %s" % (where, what))


def read_st(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", None)
    data, end = {}, 0
    for k, v in header.items():
        s, e = v["data_offsets"]
        npdt, size = DT[v["dtype"]]
        if e - s != size * int(np.prod(v["shape"], dtype=np.int64)):
            fail(path, "%s byte size does not match shape" % k)
        data[k] = (v["dtype"], tuple(v["shape"]), np.frombuffer(b[8 + n + s:8 + n + e], dtype=npdt).reshape(v["shape"]))
        end = max(end, e)
    if 8 + n + end != len(b):
        fail(path, "file size %d != header end %d" % (len(b), 8 + n + end))
    return data, meta


def is_moe(cfg, i):
    return (cfg.get("n_routed_experts") is not None and i >= cfg["first_k_dense_replace"]
            and i % cfg.get("moe_layer_freq", 1) == 0)


def expected_weights(cfg):
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    dn, dr, dv, dc = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    w = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = (H,)
        w[p + "post_attention_layernorm.weight"] = (H,)
        if cfg["q_lora_rank"] is None:
            w[p + "self_attn.q_proj.weight"] = (nh * (dn + dr), H)
        else:
            r = cfg["q_lora_rank"]
            w[p + "self_attn.q_a_proj.weight"] = (r, H)
            w[p + "self_attn.q_a_layernorm.weight"] = (r,)
            w[p + "self_attn.q_b_proj.weight"] = (nh * (dn + dr), r)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = (dc + dr, H)
        w[p + "self_attn.kv_a_layernorm.weight"] = (dc,)
        w[p + "self_attn.kv_b_proj.weight"] = (nh * (dn + dv), dc)
        w[p + "self_attn.o_proj.weight"] = (H, nh * dv)
        if is_moe(cfg, i):
            E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = (E, H)
            for e in range(E):
                pe = p + "mlp.experts.%d." % e
                w[pe + "gate_proj.weight"] = (I, H)
                w[pe + "up_proj.weight"] = (I, H)
                w[pe + "down_proj.weight"] = (H, I)
            if cfg.get("n_shared_experts"):
                Is = I * cfg["n_shared_experts"]
                w[p + "mlp.shared_experts.gate_proj.weight"] = (Is, H)
                w[p + "mlp.shared_experts.up_proj.weight"] = (Is, H)
                w[p + "mlp.shared_experts.down_proj.weight"] = (H, Is)
        else:
            I = cfg["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = (I, H)
            w[p + "mlp.up_proj.weight"] = (I, H)
            w[p + "mlp.down_proj.weight"] = (H, I)
    return w


def check_checkpoint(d, cfg):
    want_dtype = {"bfloat16": "BF16", "float32": "F32"}[cfg["torch_dtype"]]
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        wm = json.load(open(idx))
        total = 0
        for fn in sorted(set(wm["weight_map"].values())):
            data, _ = read_st(os.path.join(d, fn))
            for k, v in data.items():
                if wm["weight_map"].get(k) != fn:
                    fail(fn, "%s not mapped to this shard in the index" % k)
                total += v[2].nbytes
            tensors.update(data)
        if total != wm["metadata"]["total_size"]:
            fail(idx, "total_size %d != %d" % (wm["metadata"]["total_size"], total))
        if set(wm["weight_map"]) != set(tensors):
            fail(idx, "weight_map names differ from the shards' tensors")
    else:
        tensors, _ = read_st(os.path.join(d, "model.safetensors"))
    exp = expected_weights(cfg)
    for k in sorted(set(exp) - set(tensors)):
        fail(d, "missing tensor " + k)
    for k in sorted(set(tensors) - set(exp)):
        fail(d, "unexpected tensor " + k)
    for k in sorted(set(exp) & set(tensors)):
        if tensors[k][1] != exp[k]:
            fail(d, "%s shape %s != %s" % (k, tensors[k][1], exp[k]))
        if tensors[k][0] != want_dtype:
            fail(d, "%s dtype %s != %s" % (k, tensors[k][0], want_dtype))
    norms = [v[2] for k, v in tensors.items() if k.endswith("norm.weight")]
    if norms and all(np.all(n == n.flat[0]) for n in norms):
        fail(d, "norm weights are constant")


def check_reference(path, cfg):
    data, _ = read_st(path)
    ids = data["input_ids"][2]
    mask = data["attention_mask"][2]
    B, T = ids.shape
    L, H, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    exp = {"input_ids": ("I32", (B, T)), "attention_mask": ("I32", (B, T)), "logits": ("F32", (B, T, V))}
    for s in range(L + 2):
        exp["hidden.%d" % s] = ("F32", (B, T, H))
    for l in range(L):
        exp["mla.%d.latent" % l] = ("F32", (B, T, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]))
        if is_moe(cfg, l):
            exp["router.%d.logits" % l] = ("F32", (B, T, E))
            exp["router.%d.topk_ids" % l] = ("I32", (B, T, k))
            exp["router.%d.topk_weights" % l] = ("F32", (B, T, k))
    got = {n: (v[0], v[1]) for n, v in data.items()}
    for n in sorted(set(exp) ^ set(got)):
        fail(path, "name %s %s" % (n, "missing" if n in exp else "unexpected"))
    for n in sorted(set(exp) & set(got)):
        if got[n] != exp[n]:
            fail(path, "%s is %s, expected %s" % (n, got[n], exp[n]))
    # inputs
    eos = cfg["eos_token_id"]
    lengths = mask.sum(1)
    if B < 3 or len(set(lengths.tolist())) != B:
        fail(path, "need >= 3 rows of different lengths, got %s" % lengths.tolist())
    if lengths[0] != T or lengths.max() != T:
        fail(path, "row 0 must be unpadded and the longest")
    for r in range(B):
        pad = T - lengths[r]
        if mask[r, :pad].any() or not mask[r, pad:].all() or (ids[r, :pad] != eos).any():
            fail(path, "row %d is not left padded with eos" % r)
    valid = mask.astype(bool)
    for n, v in data.items():
        if v[0] == "F32" and not np.isfinite(v[2][valid]).all():
            fail(path, n + " has non-finite values at real tokens")
    # router semantics
    for l in range(L):
        if not is_moe(cfg, l):
            continue
        lg = data["router.%d.logits" % l][2][valid].astype(np.float64)
        ti = data["router.%d.topk_ids" % l][2][valid]
        tw = data["router.%d.topk_weights" % l][2][valid].astype(np.float64)
        if ti.min() < 0 or ti.max() >= E or any(len(set(r)) != k for r in ti.tolist()):
            fail(path, "router.%d.topk_ids out of range or repeated" % l)
            continue
        order_ok = all(np.all((tw[:, j] > tw[:, j + 1]) | ((tw[:, j] == tw[:, j + 1]) & (ti[:, j] < ti[:, j + 1])))
                       for j in range(k - 1))
        if not order_ok:
            fail(path, "router.%d not ordered by weight desc / id asc" % l)
        p = np.exp(lg - lg.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        raw = np.take_along_axis(p, ti.astype(np.int64), 1)
        if k > 1 and cfg["norm_topk_prob"]:
            want = raw / raw.sum(1, keepdims=True)
        else:
            want = raw * cfg["routed_scaling_factor"]
        tol = 2e-2 if path.endswith("_bf16.safetensors") else 1e-5
        if np.abs(want - tw).max() > tol * max(1.0, np.abs(want).max()):
            fail(path, "router.%d.topk_weights disagree with softmax(logits)[ids] semantics (%.3g)" %
                 (l, np.abs(want - tw).max()))
    return data


def check_generate(path, cfg, ref):
    g = json.load(open(path))
    cases = {c["name"]: c for c in g["cases"]}
    if len(cases) < 2:
        fail(path, "need a single-row and a batched case")
    for c in g["cases"]:
        ids, m, out = np.array(c["input_ids"]), np.array(c["attention_mask"]), np.array(c["output_ids"])
        for key in ("name", "input_ids", "attention_mask", "max_new_tokens", "output_ids", "eos_token_id"):
            if key not in c:
                fail(path, "case %s lacks %s" % (c.get("name"), key))
        if out.shape[0] != ids.shape[0] or not (out[:, :ids.shape[1]] == ids).all():
            fail(path, "case %s: output does not start with the prompt" % c["name"])
        n_new = out.shape[1] - ids.shape[1]
        if not 1 <= n_new <= c["max_new_tokens"]:
            fail(path, "case %s: %d new tokens" % (c["name"], n_new))
        if out.min() < 0 or out.max() >= cfg["vocab_size"]:
            fail(path, "case %s: id out of vocabulary" % c["name"])
        if ids.shape[0] >= 3 and len(set(m.sum(1).tolist())) != ids.shape[0]:
            fail(path, "case %s: rows must have different lengths" % c["name"])
    if ref is not None:
        b = cases.get("batch_left_padded")
        if b and not (np.array(b["input_ids"]) == ref["input_ids"][2]).all():
            fail(path, "batched case prompts differ from reference input_ids")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures")
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "config.json")))
    if len(names) < 3:
        fail(root, "expected at least 3 fixtures, found %d" % len(names))
    total = 0
    for n in names:
        d = os.path.join(root, n)
        for fn in os.listdir(d):
            total += os.path.getsize(os.path.join(d, fn))
        cfg = json.load(open(os.path.join(d, "config.json")))
        if cfg.get("model_type") != "deepseek_v2":
            fail(d, "model_type")
        check_checkpoint(d, cfg)
        ref = check_reference(os.path.join(d, "reference.safetensors"), cfg)
        check_reference(os.path.join(d, "reference_bf16.safetensors"), cfg)
        check_generate(os.path.join(d, "generate.json"), cfg, ref)
        print("%-32s checked" % n)
    if total >= 5 * 1024 * 1024:
        fail(root, "fixtures total %d bytes >= 5 MB" % total)
    print("total %.2f MB" % (total / 1e6))
    for p in problems:
        print("PROBLEM " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
