"""Independent pure-torch forward pass of DeepSeek-V2 with the OFFICIAL semantics.

Written from the spec (/work/shared/design/deepseek-v2-architecture.md, sections 3-5),
not from transformers. It is the second oracle: make_fixtures.py asserts that the
patched transformers model and this file agree in float32.

Deliberately different code paths from transformers' native DeepseekV2, so that an error
in one is unlikely to be repeated in the other:
  * RoPE follows the official remote code: de-interleave the 64 (here qk_rope_head_dim)
    rope lanes, then rotate-half with cat(cos, cos) tables (native uses complex pairs).
  * Router follows the official code: softmax in fp32, greedy or group_limited_greedy,
    then normalise (norm_topk_prob and top_k > 1) XOR multiply by routed_scaling_factor.
  * MoE layer iff n_routed_experts and idx >= first_k_dense_replace and idx % moe_layer_freq == 0.
  * Softmax scale = qk_head_dim^-0.5 * get_mscale(factor, mscale_all_dim)^2 when rope_scaling
    is set and mscale_all_dim != 0.

All arithmetic runs in `dtype` (float32 or float64) on the stored weights upcast.
Works with torch >= 1.13 (tested locally with Debian's 1.13 and on the GPU machine with 2.11).
"""

import math

import torch


def get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq_and_amplitude(cfg, dtype=torch.float64):
    """Returns (inv_freq [d/2], cos/sin amplitude) exactly as the official YaRN code builds them."""
    d = cfg["qk_rope_head_dim"]
    base = float(cfg["rope_theta"])
    exponent = torch.arange(0, d, 2, dtype=torch.float32) / d
    freq_extra = 1.0 / (base ** exponent)
    rs = cfg.get("rope_scaling")
    if not rs:
        return freq_extra.to(dtype), 1.0
    assert rs.get("type", rs.get("rope_type")) == "yarn", rs
    factor = float(rs["factor"])
    l0 = rs["original_max_position_embeddings"]
    beta_fast = rs.get("beta_fast", 32)
    beta_slow = rs.get("beta_slow", 1)
    freq_inter = 1.0 / (factor * base ** exponent)

    def corr_dim(rot):
        return (d * math.log(l0 / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep_extra = 1.0 - ramp
    inv_freq = freq_inter * (1 - keep_extra) + freq_extra * keep_extra
    amplitude = get_mscale(factor, rs.get("mscale", 1)) / get_mscale(factor, rs.get("mscale_all_dim", 0))
    return inv_freq.to(dtype), float(amplitude)


def softmax_scale(cfg):
    qk_head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    s = qk_head_dim ** -0.5
    rs = cfg.get("rope_scaling")
    if rs:
        mad = rs.get("mscale_all_dim", 0)
        if mad:
            m = get_mscale(float(rs["factor"]), mad)
            s = s * m * m
    return s


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_official_rope(x, cos, sin):
    """x [B,nh,T,d]; cos/sin [B,T,d] (cat(freqs,freqs) layout). Official: de-interleave then rotate-half."""
    b, h, t, d = x.shape
    x = x.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def is_moe_layer(cfg, idx):
    return (cfg.get("n_routed_experts") is not None
            and idx >= cfg["first_k_dense_replace"]
            and idx % cfg.get("moe_layer_freq", 1) == 0)


def swiglu(x, wg, wu, wd):
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T) @ wd.T


def route(cfg, x, wg):
    """x [N,H] -> logits [N,E], ids [N,k], weights [N,k] (official order-agnostic selection)."""
    logits = x @ wg.T
    scores = logits.softmax(dim=-1)
    k = cfg["num_experts_per_tok"]
    method = cfg["topk_method"]
    if method == "greedy":
        w, ids = torch.topk(scores, k=k, dim=-1)
    elif method == "group_limited_greedy":
        n = scores.shape[0]
        ng, tg = cfg["n_group"], cfg["topk_group"]
        group_scores = scores.view(n, ng, -1).max(dim=-1).values
        group_idx = torch.topk(group_scores, k=tg, dim=-1).indices
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(n, ng, scores.shape[1] // ng).reshape(n, -1)
        masked = scores.masked_fill(~score_mask.bool(), 0.0)
        w, ids = torch.topk(masked, k=k, dim=-1)
    else:
        raise ValueError("unsupported topk_method " + method)
    if k > 1 and cfg["norm_topk_prob"]:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        w = w * cfg["routed_scaling_factor"]
    return logits, ids, w


def sort_topk(ids, w):
    """Order by weight descending, ties -> lower expert id first."""
    o = torch.argsort(ids, dim=-1)
    ids, w = ids.gather(-1, o), w.gather(-1, o)
    o = torch.sort(-w, dim=-1, stable=True).indices
    return ids.gather(-1, o), w.gather(-1, o)


@torch.no_grad()
def forward(cfg, weights, input_ids, attention_mask, position_ids, dtype=torch.float32):
    """weights: dict official name -> tensor (any float dtype). Returns dict of dump tensors
    with a leading batch dim, in the naming of atlas --dump (router ids already sorted)."""
    W = {k: v.to(dtype) for k, v in weights.items()}
    eps = cfg["rms_norm_eps"]
    B, T = input_ids.shape
    nh = cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    dc = cfg["kv_lora_rank"]
    L = cfg["num_hidden_layers"]
    out = {}

    inv_freq, amp = rope_inv_freq_and_amplitude(cfg, dtype)
    freqs = position_ids.to(dtype).unsqueeze(-1) * inv_freq  # [B,T,d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * amp, emb.sin() * amp
    scale = softmax_scale(cfg)

    am = attention_mask.bool()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal.unsqueeze(0) & am.unsqueeze(1)  # [B,Tq,Tk]
    neg = torch.finfo(dtype).min

    h = W["model.embed_tokens.weight"][input_ids]
    out["hidden.0"] = h
    for i in range(L):
        p = "model.layers.%d." % i
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)
        if cfg.get("q_lora_rank") is None:
            q = x @ W[p + "self_attn.q_proj.weight"].T
        else:
            qa = rms_norm(x @ W[p + "self_attn.q_a_proj.weight"].T, W[p + "self_attn.q_a_layernorm.weight"], eps)
            q = qa @ W[p + "self_attn.q_b_proj.weight"].T
        q = q.view(B, T, nh, dn + dr).transpose(1, 2)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        a = x @ W[p + "self_attn.kv_a_proj_with_mqa.weight"].T  # [B,T,dc+dr]
        out["mla.%d.latent" % i] = a
        c, k_pe = a[..., :dc], a[..., dc:]
        c = rms_norm(c, W[p + "self_attn.kv_a_layernorm.weight"], eps)
        kv = (c @ W[p + "self_attn.kv_b_proj.weight"].T).view(B, T, nh, dn + dv).transpose(1, 2)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        q_pe = apply_official_rope(q_pe, cos, sin)
        k_pe = apply_official_rope(k_pe.view(B, 1, T, dr), cos, sin)
        Q = torch.cat((q_nope, q_pe), dim=-1)
        K = torch.cat((k_nope, k_pe.expand(B, nh, T, dr)), dim=-1)
        S = (Q @ K.transpose(2, 3)) * scale
        S = S.masked_fill(~allowed.unsqueeze(1), neg)
        P = S.softmax(dim=-1)
        O = (P @ v).transpose(1, 2).reshape(B, T, nh * dv)
        h = h + O @ W[p + "self_attn.o_proj.weight"].T

        x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, i):
            xf = x.reshape(B * T, -1)
            logits, ids, w = route(cfg, xf, W[p + "mlp.gate.weight"])
            y = torch.zeros_like(xf)
            for e in range(cfg["n_routed_experts"]):
                sel = ids == e  # [N,k]
                rows = sel.any(-1)
                if not rows.any():
                    continue
                we = (w * sel).sum(-1)[rows].unsqueeze(-1)
                pe = p + "mlp.experts.%d." % e
                y[rows] += we * swiglu(xf[rows], W[pe + "gate_proj.weight"], W[pe + "up_proj.weight"],
                                      W[pe + "down_proj.weight"])
            if cfg.get("n_shared_experts"):
                ps = p + "mlp.shared_experts."
                y = y + swiglu(xf, W[ps + "gate_proj.weight"], W[ps + "up_proj.weight"], W[ps + "down_proj.weight"])
            mlp = y.view(B, T, -1)
            sids, sw = sort_topk(ids, w)
            k = ids.shape[-1]
            out["router.%d.logits" % i] = logits.view(B, T, -1)
            out["router.%d.topk_ids" % i] = sids.view(B, T, k).to(torch.int32)
            out["router.%d.topk_weights" % i] = sw.view(B, T, k)
        else:
            mlp = swiglu(x, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        h = h + mlp
        out["hidden.%d" % (i + 1)] = h
    hn = rms_norm(h, W["model.norm.weight"], eps)
    out["hidden.%d" % (L + 1)] = hn
    out["logits"] = hn @ W["lm_head.weight"].T
    return out


@torch.no_grad()
def greedy_generate(cfg, weights, input_ids, attention_mask, max_new_tokens, eos_id, pad_id,
                    dtype=torch.float32):
    """Uncached greedy decoding that mirrors transformers' generate contract: the mask grows by 1
    for every new token (also for finished rows), finished rows get pad_id, stop when all finished."""
    ids = input_ids.clone()
    mask = attention_mask.clone()
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    margins = []
    for _ in range(max_new_tokens):
        pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        logits = forward(cfg, weights, ids, mask, pos, dtype)["logits"][:, -1, :]
        top2 = torch.topk(logits, 2, dim=-1).values
        margins.append((top2[:, 0] - top2[:, 1])[~finished])
        nxt = logits.argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        finished |= nxt == eos_id
        if finished.all():
            break
    m = torch.cat(margins) if margins else torch.zeros(0)
    return ids, float(m.min()) if m.numel() else float("inf")
