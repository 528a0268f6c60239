#!/usr/bin/env python3
"""Create tiny DeepSeek-V2 reference checkpoints + reference tensors for atlas.

Run on the GPU machine (needs torch + transformers + safetensors; runs on the CPU there):
    python3 tools/reference/make_fixtures.py --out /tmp/fx --tar $OUT/fixtures.tar
Local smoke test without transformers (official oracle only; NOT a deliverable):
    python3 tools/reference/make_fixtures.py --out /tmp/fx --no-transformers

For each fixture <name> it writes <out>/<name>/:
    config.json, model.safetensors (or 2 shards + model.safetensors.index.json)
    reference.safetensors       patched-transformers float32 forward (official semantics)
    reference_bf16.safetensors  same model and inputs, model in bfloat16
    generate.json               greedy generation reference (transformers generate, f32)
    meta.json                   versions, seeds, patches, oracle agreement, bf16-vs-f32 deltas

See tools/reference/README.md. The oracle follows the OFFICIAL DeepSeek-V2 semantics, not native
transformers: the native model is patched where it differs (router normalisation, and whatever the
runtime checks below find: softmax mscale^2, YaRN tables, weight loading, optional shared experts).
"""

import argparse
import copy
import io
import json
import math
import os
import struct
import sys
import tarfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import official_torch as OT  # noqa: E402

# --------------------------------------------------------------------------------------------
# Fixture definitions. Every field of the real DeepSeek-V2-Lite config.json is present
# (auto_map dropped: it names remote-code files that are not shipped).
# --------------------------------------------------------------------------------------------

BOS, EOS = 0, 1


def base_config():
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 48,
        "initializer_range": 0.02,
        "intermediate_size": 96,
        "kv_lora_rank": 32,
        "max_position_embeddings": 64,
        "model_type": "deepseek_v2",
        "moe_intermediate_size": 32,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "num_attention_heads": 4,
        "num_experts_per_tok": 3,
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "pretraining_tp": 1,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1",
        "use_cache": True,
        "v_head_dim": 16,
        "vocab_size": 320,
    }


def fixture_specs():
    specs = []
    # 1. Lite-like: q_proj, greedy, no renormalisation, scaling 2.5 applied, YaRN past 16 positions.
    c = base_config()
    c.update({
        "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        # = factor * original_max_position_embeddings (transformers may derive the factor from this ratio)
        "max_position_embeddings": 64,
        "routed_scaling_factor": 2.5,
    })
    specs.append({"name": "tiny_lite_yarn_bf16", "seed": 1008, "store_dtype": "bfloat16", "shards": 1,
                  "lengths": [24, 19, 11, 4], "config": c})
    # 2. V2-236B-like: q LoRA, group_limited_greedy, renormalised (scaling 2.5 must be IGNORED),
    #    no rope scaling, two dense layers, v_head_dim != qk_nope_head_dim, sharded checkpoint.
    c = base_config()
    c.update({
        "hidden_size": 64, "num_hidden_layers": 4, "q_lora_rank": 24, "qk_rope_head_dim": 8,
        "v_head_dim": 24, "intermediate_size": 128, "n_shared_experts": 1,
        "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 2,
        "max_position_embeddings": 128, "vocab_size": 384,
    })
    specs.append({"name": "tiny_v2_group_qlora_bf16", "seed": 2003, "store_dtype": "bfloat16", "shards": 2,
                  "lengths": [22, 17, 9, 3], "config": c})
    # 3. F32 weights: no shared experts (0), top-2 renormalised, YaRN with a real ramp blend
    #    (low 0 < k < high 3) and cos/sin amplitude != 1 (mscale 1.0 vs mscale_all_dim 0.707).
    c = base_config()
    c.update({
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 16, "v_head_dim": 8,
        "intermediate_size": 64, "moe_intermediate_size": 16,
        # 0 = no shared experts (official: zero-width MLP adding 0; transformers 5.17 rejects null)
        "n_shared_experts": 0,
        "num_experts_per_tok": 2, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "rope_theta": 1000,
        "rope_scaling": {"type": "yarn", "factor": 8, "original_max_position_embeddings": 16,
                         "beta_fast": 8, "beta_slow": 0.25, "mscale": 1.0, "mscale_all_dim": 0.707},
        "max_position_embeddings": 128, "vocab_size": 256, "torch_dtype": "float32",
    })
    specs.append({"name": "tiny_f32_yarnblend_noshared", "seed": 3005, "store_dtype": "float32", "shards": 1,
                  "lengths": [26, 20, 13, 5], "config": c})
    return specs


# --------------------------------------------------------------------------------------------
# Deterministic weights with official tensor names (spec section 2).
# --------------------------------------------------------------------------------------------

def make_weights(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh = cfg["num_attention_heads"]
    dn, dr, dv, dc = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    W = {}

    def lin(name, out_f, in_f, gain=1.0):
        W[name] = torch.randn(out_f, in_f, generator=g) * (gain / math.sqrt(in_f))

    def norm(name, n):
        W[name] = 1.0 + 0.15 * torch.randn(n, generator=g)  # not all ones

    W["model.embed_tokens.weight"] = torch.randn(V, H, generator=g)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        if cfg["q_lora_rank"] is None:
            lin(p + "self_attn.q_proj.weight", nh * (dn + dr), H)
        else:
            r = cfg["q_lora_rank"]
            lin(p + "self_attn.q_a_proj.weight", r, H)
            norm(p + "self_attn.q_a_layernorm.weight", r)
            lin(p + "self_attn.q_b_proj.weight", nh * (dn + dr), r)
        lin(p + "self_attn.kv_a_proj_with_mqa.weight", dc + dr, H)
        norm(p + "self_attn.kv_a_layernorm.weight", dc)
        lin(p + "self_attn.kv_b_proj.weight", nh * (dn + dv), dc)
        lin(p + "self_attn.o_proj.weight", H, nh * dv, 0.7)
        if OT.is_moe_layer(cfg, i):
            E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            lin(p + "mlp.gate.weight", E, H, 3.0)  # decisive routing (few near-ties)
            for e in range(E):
                pe = p + "mlp.experts.%d." % e
                lin(pe + "gate_proj.weight", I, H)
                lin(pe + "up_proj.weight", I, H)
                lin(pe + "down_proj.weight", H, I, 0.7)
            if cfg.get("n_shared_experts"):
                Is = I * cfg["n_shared_experts"]
                ps = p + "mlp.shared_experts."
                lin(ps + "gate_proj.weight", Is, H)
                lin(ps + "up_proj.weight", Is, H)
                lin(ps + "down_proj.weight", H, Is, 0.7)
        else:
            I = cfg["intermediate_size"]
            lin(p + "mlp.gate_proj.weight", I, H)
            lin(p + "mlp.up_proj.weight", I, H)
            lin(p + "mlp.down_proj.weight", H, I, 0.7)
    norm("model.norm.weight", H)
    lin("lm_head.weight", V, H, 2.0)
    return W


# --------------------------------------------------------------------------------------------
# Minimal deterministic safetensors writer (sorted names; also verified by reading back with the
# safetensors library on the GPU machine).
# --------------------------------------------------------------------------------------------

_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int32: "I32", torch.float16: "F16"}
_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def tensor_bytes(t):
    t = t.contiguous().cpu()
    if t.dtype in _INT_VIEW:
        t = t.view(_INT_VIEW[t.dtype])
    assert sys.byteorder == "little"
    return t.numpy().tobytes()


def safetensors_bytes(tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name]
        b = tensor_bytes(t)
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_file(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_json(path, obj):
    write_file(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_checkpoint(d, cfg, weights, store_dtype, shards):
    dt = getattr(torch, store_dtype)
    stored = {k: v.to(dt) for k, v in weights.items()}
    write_json(os.path.join(d, "config.json"), cfg)
    if shards == 1:
        write_file(os.path.join(d, "model.safetensors"), safetensors_bytes(stored, {"format": "pt"}))
    else:
        names = sorted(stored)
        per = (len(names) + shards - 1) // shards
        wmap, total = {}, 0
        for s in range(shards):
            fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            part = {n: stored[n] for n in names[s * per:(s + 1) * per]}
            for n in part:
                wmap[n] = fn
                total += part[n].numel() * part[n].element_size()
            write_file(os.path.join(d, fn), safetensors_bytes(part, {"format": "pt"}))
        write_json(os.path.join(d, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": wmap})
    # the values every oracle uses: stored weights upcast
    return {k: v.to(torch.float32) for k, v in stored.items()}


# --------------------------------------------------------------------------------------------
# Inputs: B rows, left padded with pad = eos; row 0 unpadded and longest.
# --------------------------------------------------------------------------------------------

def make_inputs(cfg, seed, lengths):
    g = torch.Generator().manual_seed(seed + 7)
    T = lengths[0]
    assert all(l <= T for l in lengths)
    ids = torch.full((len(lengths), T), EOS, dtype=torch.long)
    mask = torch.zeros((len(lengths), T), dtype=torch.long)
    for r, l in enumerate(lengths):
        row = torch.randint(2, cfg["vocab_size"], (l,), generator=g)
        row[0] = BOS
        ids[r, T - l:] = row
        mask[r, T - l:] = 1
    return ids, mask, positions_from_mask(mask)


def positions_from_mask(mask):
    # transformers' generate: cumsum(mask) - 1, pad positions filled with 1
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


# --------------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------------

def valid_rows(t, mask):
    return t[mask.bool()]  # [N_valid, ...]


def rel_err(a, b, mask):
    a, b = valid_rows(a, mask).double(), valid_rows(b, mask).double()
    den = b.abs().max().item()
    return (a - b).abs().max().item() / (den if den > 0 else 1.0)


def compare_dumps(test, ref, mask):
    """Per-tensor: rel err for floats, mismatch count for ids (valid positions only)."""
    res = {}
    for k in sorted(ref):
        if k in ("input_ids", "attention_mask"):
            continue
        a, b = test[k], ref[k]
        assert a.shape == b.shape, (k, a.shape, b.shape)
        if b.dtype == torch.int32:
            res[k] = {"mismatches": int((valid_rows(a, mask) != valid_rows(b, mask)).any(-1).sum())}
        else:
            va, vb = valid_rows(a, mask).double(), valid_rows(b, mask).double()
            res[k] = {"max_abs": (va - vb).abs().max().item(), "rel": rel_err(a, b, mask),
                      "max_abs_ref": vb.abs().max().item()}
    return res


def router_margins(cfg, ref, mask):
    """Smallest gap between the last selected and first unselected score (selection robustness)."""
    out = {}
    k = cfg["num_experts_per_tok"]
    for name in ref:
        if not name.endswith(".logits") or not name.startswith("router."):
            continue
        l = int(name.split(".")[1])
        s = valid_rows(ref[name], mask).double().softmax(-1)
        info = {}
        if cfg["topk_method"] == "group_limited_greedy":
            ng, tg = cfg["n_group"], cfg["topk_group"]
            gs = s.view(s.shape[0], ng, -1).max(-1).values.sort(-1, descending=True).values
            info["group_gap_min"] = (gs[:, tg - 1] - gs[:, tg]).min().item()
            greedy_ids = torch.topk(s, k).indices.sort(-1).values
            chosen = valid_rows(ref["router.%d.topk_ids" % l], mask).long().sort(-1).values
            info["tokens_where_group_limit_changes_selection"] = int((greedy_ids != chosen).any(-1).sum())
            gm = torch.zeros(s.shape[0], ng, dtype=torch.bool)
            top_groups = s.view(s.shape[0], ng, -1).max(-1).values.topk(tg).indices
            gm.scatter_(1, top_groups, True)
            elig = gm.unsqueeze(-1).expand(-1, -1, s.shape[1] // ng).reshape(s.shape[0], -1)
            s_masked = s.masked_fill(~elig, 0.0)
            ss = s_masked.sort(-1, descending=True).values
        else:
            ss = s.sort(-1, descending=True).values
        info["topk_gap_min"] = (ss[:, k - 1] - ss[:, k]).min().item()
        out[name.rsplit(".", 1)[0]] = info
    return out


# --------------------------------------------------------------------------------------------
# transformers: load, patch, run
# --------------------------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.on = False
        self.t = {}


def patch_moe_class(moe_cls, patches):
    """Class-level patch of the MoE forward: native selection + official weight semantics."""
    if getattr(moe_cls, "_atlas_patched", False):
        patches.append(moe_cls._atlas_patch_note)
        return

    def forward(self, hidden_states):
        cfg = self._atlas_cfg
        residuals = hidden_states
        orig_shape = hidden_states.shape
        k = cfg["num_experts_per_tok"]
        # native selection (DeepseekV2TopkRouter: greedy / group_limited_greedy); it ALWAYS multiplies
        # the selected softmax probabilities by routed_scaling_factor
        router_logits, w, ids = self.gate(hidden_states)
        if k > 1 and cfg["norm_topk_prob"]:
            # official: normalise and do NOT scale (native ignores norm_topk_prob)
            w = w / cfg["routed_scaling_factor"]
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        rec = self._atlas_rec
        if rec.on:
            l = self._atlas_layer
            sids, sw = OT.sort_topk(ids, w)
            rec.t["router.%d.logits" % l] = router_logits.reshape(-1, router_logits.shape[-1]).float()
            rec.t["router.%d.topk_ids" % l] = sids.to(torch.int32)
            rec.t["router.%d.topk_weights" % l] = sw.float()
        flat = hidden_states.view(-1, hidden_states.shape[-1])
        out = self.experts(flat, ids, w).view(*orig_shape)
        if getattr(self, "shared_experts", None) is not None:
            out = out + self.shared_experts(residuals)
        return out

    moe_cls.forward = forward
    moe_cls._atlas_patched = True
    moe_cls._atlas_patch_note = ("%s.forward replaced: router logits and expert selection from the native gate module "
                   "(fp32 logits, softmax, greedy / group_limited_greedy, weights x routed_scaling_factor); then "
                   "official weights: if top_k>1 and norm_topk_prob, w = raw/(sum(raw)+1e-20) with NO "
                   "routed_scaling_factor (native ignores norm_topk_prob and always multiplies); else "
                   "raw*routed_scaling_factor as native. Experts and shared experts are the native modules."
                   % moe_cls.__name__)
    patches.append(moe_cls._atlas_patch_note)


def native_param_expectation(name, W, shape):
    """Map a native parameter name to the expected tensor built from official tensors."""
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        p = name.rsplit("experts.", 1)[0]
        es = sorted({int(k[len(p) + 8:].split(".")[0]) for k in W if k.startswith(p + "experts.")})
        if name.endswith("gate_up_proj"):
            t = torch.stack([torch.cat([W[p + "experts.%d.gate_proj.weight" % e],
                                        W[p + "experts.%d.up_proj.weight" % e]], 0) for e in es])
        else:
            t = torch.stack([W[p + "experts.%d.down_proj.weight" % e] for e in es])
        if tuple(t.shape) != tuple(shape) and tuple(t.transpose(1, 2).shape) == tuple(shape):
            t = t.transpose(1, 2).contiguous()
        return t
    return W.get(name)


def load_patched(M, d, cfg, W, dtype, patches, notes, rec, attn="eager", device=None):
    """W: the official tensors to check every native parameter against (None: skip the check,
    for full-size checkpoints the benchmark loads straight to the GPU)."""
    kwargs = {"attn_implementation": attn, "dtype": dtype, "output_loading_info": True}
    if device is not None:
        kwargs["device_map"] = device
    model, info = M.DeepseekV2ForCausalLM.from_pretrained(d, **kwargs)
    model.eval()
    moe_classes = {type(l.mlp) for l in model.model.layers if hasattr(l.mlp, "experts")}
    for mc in moe_classes:
        patch_moe_class(mc, patches)
    notes["moe_class"] = sorted(c.__name__ for c in moe_classes)
    notes.setdefault("loading_info", {k: sorted(map(str, v)) for k, v in info.items() if v})
    # 1. weights: every native parameter must equal the official tensor(s) it stands for
    sd = model.state_dict() if W is not None else {}
    fixed = []
    for name, p in sd.items():
        exp = native_param_expectation(name, W, p.shape)
        if exp is None and p.numel() == 0:
            continue
        if exp is None:
            notes.setdefault("unmapped_native_tensors", []).append("%s %s" % (name, tuple(p.shape)))
            continue
        exp = exp.to(p.dtype)
        if tuple(exp.shape) != tuple(p.shape):
            raise RuntimeError("shape mismatch for %s: native %s official %s" % (name, tuple(p.shape),
                                                                                 tuple(exp.shape)))
        if not torch.equal(p, exp):
            fixed.append(name)
            with torch.no_grad():
                p.copy_(exp)
    if fixed:
        patches.append("weights re-assigned after from_pretrained for %d tensors (e.g. %s)" % (len(fixed), fixed[:3]))
    notes["weights_equal_after_from_pretrained"] = (not fixed) if W is not None else "not checked"
    # 2. layer kinds (native ignores moe_layer_freq; the fixtures use 1, so they must agree)
    for i, layer in enumerate(model.model.layers):
        is_moe = hasattr(layer.mlp, "experts")
        if is_moe != OT.is_moe_layer(cfg, i):
            raise RuntimeError("layer %d kind differs from official (moe_layer_freq?)" % i)
        if is_moe:
            layer.mlp._atlas_cfg = cfg
            layer.mlp._atlas_layer = i
            layer.mlp._atlas_rec = rec
    # 3. softmax scale (official multiplies by mscale^2 under YaRN)
    want = OT.softmax_scale(cfg)
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        notes.setdefault("native_softmax_scale", float(a.scaling))
        if abs(float(a.scaling) - want) > 1e-7 * want:
            a.scaling = want
            if i == 0:
                patches.append("self_attn.scaling set to official qk_head_dim^-0.5*mscale^2 = %.9g "
                               "(native had %.9g)" % (want, notes["native_softmax_scale"]))
    notes["official_softmax_scale"] = want
    # 4. RoPE tables: inv_freq and cos/sin amplitude must be the official YaRN ones
    rot = model.model.rotary_emb
    inv, amp = OT.rope_inv_freq_and_amplitude(cfg, torch.float32)
    notes["native_inv_freq"] = [float(x) for x in rot.inv_freq.float()]
    notes["official_inv_freq"] = [float(x) for x in inv]
    notes["native_attention_scaling"] = float(rot.attention_scaling)
    notes["official_rope_amplitude"] = amp
    if rot.inv_freq.shape != inv.shape or not torch.allclose(rot.inv_freq.float().cpu(), inv, rtol=1e-6, atol=0):
        rot.inv_freq = inv.to(rot.inv_freq.device)
        patches.append("rotary_emb.inv_freq replaced by the official YaRN inv_freq")
    if abs(float(rot.attention_scaling) - amp) > 1e-7:
        rot.attention_scaling = amp
        patches.append("rotary_emb.attention_scaling set to official amplitude %.9g" % amp)
    return model


def run_transformers(model, rec, ids, mask, pos):
    B, T = ids.shape
    hooks = []

    def hook(name):
        def f(_m, _inp, out):
            if rec.on:
                o = out[0] if isinstance(out, (tuple, list)) else out
                rec.t[name] = o.detach().float().reshape(B, T, -1)
        return f

    m = model.model
    L = len(m.layers)
    hooks.append(m.embed_tokens.register_forward_hook(hook("hidden.0")))
    for i, layer in enumerate(m.layers):
        hooks.append(layer.register_forward_hook(hook("hidden.%d" % (i + 1))))
        hooks.append(layer.self_attn.kv_a_proj_with_mqa.register_forward_hook(hook("mla.%d.latent" % i)))
    hooks.append(m.norm.register_forward_hook(hook("hidden.%d" % (L + 1))))
    rec.t = {}
    rec.on = True
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    finally:
        rec.on = False
        for h in hooks:
            h.remove()
    t = dict(rec.t)
    for k in list(t):
        if k.startswith("router."):
            t[k] = t[k].reshape(B, T, -1)
    t["logits"] = out.logits.detach().float()
    return t


def finalize_dump(t, ids, mask):
    d = {k: (v.to(torch.int32) if v.dtype == torch.int32 else v.to(torch.float32)).contiguous() for k, v in t.items()}
    d["input_ids"] = ids.to(torch.int32)
    d["attention_mask"] = mask.to(torch.int32)
    return d


def expected_names(cfg):
    L = cfg["num_hidden_layers"]
    names = {"hidden.%d" % s for s in range(L + 2)} | {"logits", "input_ids", "attention_mask"}
    for l in range(L):
        names.add("mla.%d.latent" % l)
        if OT.is_moe_layer(cfg, l):
            names |= {"router.%d.%s" % (l, x) for x in ("logits", "topk_ids", "topk_weights")}
    return names


# --------------------------------------------------------------------------------------------

def build_fixture(spec, out_dir, use_tf, log):
    name, cfg, seed = spec["name"], spec["config"], spec["seed"]
    d = os.path.join(out_dir, name)
    W = save_checkpoint(d, cfg, make_weights(cfg, seed), spec["store_dtype"], spec["shards"])
    ids, mask, pos = make_inputs(cfg, seed, spec["lengths"])
    meta = {"name": name, "weights_seed": seed, "inputs_seed": seed + 7, "store_dtype": spec["store_dtype"],
            "shards": spec["shards"], "row_lengths": spec["lengths"], "pad_id": EOS, "eos_id": EOS, "bos_id": BOS,
            "position_ids": pos.tolist(),
            "note": "values at positions where attention_mask == 0 are unspecified: compare only real tokens"}
    off32 = finalize_dump(OT.forward(cfg, W, ids, mask, pos, torch.float32), ids, mask)
    off64 = finalize_dump(OT.forward(cfg, W, ids, mask, pos, torch.float64), ids, mask)
    assert set(off32) == expected_names(cfg), sorted(set(off32) ^ expected_names(cfg))
    meta["official_f32_vs_official_f64"] = compare_dumps(off32, off64, mask)
    max_new = 16
    gen_cases = [("single_row0", ids[:1], mask[:1]), ("batch_left_padded", ids, mask)]

    if not use_tf:
        ref, ref_bf16, patches = off32, None, ["(local smoke run: official_torch only)"]
        gens = []
        for cname, gi, gm in gen_cases:
            out_ids, margin = OT.greedy_generate(cfg, W, gi, gm, max_new, EOS, EOS)
            gens.append((cname, gi, gm, out_ids, margin, None))
    else:
        import transformers
        from transformers.models.deepseek_v2 import modeling_deepseek_v2 as M
        patches, notes = [], {}
        rec = Recorder()
        model = load_patched(M, d, cfg, W, torch.float32, patches, notes, rec)
        ref = finalize_dump(run_transformers(model, rec, ids, mask, pos), ids, mask)
        assert set(ref) == set(off32), sorted(set(ref) ^ set(off32))
        agree = compare_dumps(ref, off32, mask)
        meta["transformers_f32_vs_official_f32"] = agree
        meta["transformers_f32_vs_official_f64"] = compare_dumps(ref, off64, mask)
        bad = {k: v for k, v in agree.items() if v.get("mismatches", 0) or v.get("rel", 0) > 2e-5}
        if bad:
            log("ORACLE DISAGREEMENT %s: %s" % (name, json.dumps(bad)))
            meta["ORACLE_DISAGREEMENT"] = bad
        gens = []
        for cname, gi, gm in gen_cases:
            with torch.no_grad():
                g_out = model.generate(input_ids=gi, attention_mask=gm, max_new_tokens=max_new, do_sample=False,
                                       pad_token_id=EOS, eos_token_id=EOS, use_cache=True)
            o_out, margin = OT.greedy_generate(cfg, W, gi, gm, max_new, EOS, EOS)
            same = g_out.shape == o_out.shape and torch.equal(g_out, o_out)
            if not same:
                log("GENERATE DISAGREEMENT %s/%s:\n%s\n%s" % (name, cname, g_out.tolist(), o_out.tolist()))
            gens.append((cname, gi, gm, g_out, margin, same))
        patches_bf16 = []
        model_bf = load_patched(M, d, cfg, W, torch.bfloat16, patches_bf16, {}, rec)
        meta["patches_bf16_model"] = patches_bf16
        ref_bf16 = finalize_dump(run_transformers(model_bf, rec, ids, mask, pos), ids, mask)
        meta["bf16_vs_f32"] = compare_dumps(ref_bf16, ref, mask)
        meta["bf16_logits_argmax_mismatches"] = int(
            (valid_rows(ref_bf16["logits"], mask).argmax(-1) != valid_rows(ref["logits"], mask).argmax(-1)).sum())
        meta["patches"] = patches
        meta["transformers_notes"] = notes
        meta["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "python": sys.version.split()[0]}
        # read back our files with the safetensors library
        from safetensors import safe_open
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(d, fn), "pt") as f:
                    for k in f.keys():
                        f.get_tensor(k)

    meta["router_selection_margins"] = router_margins(cfg, ref, mask)
    lv = valid_rows(ref["logits"], mask).double().sort(-1, descending=True).values
    meta["logits_top1_top2_gap_min"] = (lv[:, 0] - lv[:, 1]).min().item()
    write_file(os.path.join(d, "reference.safetensors"), safetensors_bytes(ref))
    if ref_bf16 is not None:
        write_file(os.path.join(d, "reference_bf16.safetensors"), safetensors_bytes(ref_bf16))
    cases = []
    for cname, gi, gm, out_ids, margin, same in gens:
        new = out_ids[:, gi.shape[1]:]
        cases.append({"name": cname, "input_ids": gi.tolist(), "attention_mask": gm.tolist(),
                      "max_new_tokens": max_new, "output_ids": out_ids.tolist(), "eos_token_id": EOS,
                      "pad_token_id": EOS, "eos_generated": bool((new == EOS).any()),
                      "official_uncached_greedy_agrees": same, "min_top1_top2_logit_gap": margin})
    write_json(os.path.join(d, "generate.json"), {"do_sample": False, "compute": "float32", "cases": cases})
    meta["patches"] = patches
    write_json(os.path.join(d, "meta.json"), meta)
    log("%s: done" % name)
    return meta


def make_tar(src, dst):
    with tarfile.open(dst, "w") as tf:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for fn in sorted(files):
                full = os.path.join(root, fn)
                arc = os.path.relpath(full, src)
                ti = tarfile.TarInfo(arc)
                data = open(full, "rb").read()
                ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
                tf.addfile(ti, io.BytesIO(data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory that receives one folder per fixture")
    ap.add_argument("--tar", help="also pack --out into this tar file")
    ap.add_argument("--no-transformers", action="store_true", help="local smoke run with the official oracle only")
    ap.add_argument("--only", help="build only this fixture name")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(min(8, os.cpu_count() or 1))

    def log(s):
        print(s, flush=True)

    summary, failed = {}, []
    for spec in fixture_specs():
        if a.only and spec["name"] != a.only:
            continue
        try:
            summary[spec["name"]] = build_fixture(copy.deepcopy(spec), a.out, not a.no_transformers, log)
        except Exception:  # noqa: BLE001  (keep going: one device call should show every problem)
            import traceback
            traceback.print_exc()
            failed.append(spec["name"])
    if a.tar:
        make_tar(a.out, a.tar)
    for n, m in summary.items():
        worst = max((v.get("rel", 0) for v in m.get("transformers_f32_vs_official_f32", {}).values()), default=None)
        log("%s: patches=%d oracle_max_rel=%s bf16_logits_rel=%s" % (
            n, len(m["patches"]), worst, m.get("bf16_vs_f32", {}).get("logits", {}).get("rel")))
    if failed:
        log("FAILED: %s" % failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
