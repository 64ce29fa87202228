#!/usr/bin/env python3
"""A float32 forward pass of the tiny Glm4Moe / Qwen3Moe test models, written from MODELS.md.

Not a replacement for transformers (compare_hf.py and routing_evidence.py check Tetra against
transformers itself, and routing_evidence.py checks THIS file against transformers too): it is a
stand-in for machines without transformers, used to dry-run the comparison scripts on the CPU
machine, and it exposes what transformers hides behind module hooks: the router scores of every
MoE layer and position (for top-k margins), optional bf16 rounding between ops (an emulation of
a bf16 engine), and forced expert choices.

forward(tensors, config, ids, ...) -> (logits [T, V] f32, routes)
  routes: one dict per MoE layer: {"layer": L, "sel": [T, E] selection keys (biased, masked
  experts -inf), "ids": [T, k] chosen experts, "group_margin": [T] or None}
"""

import torch


def rms_norm(x, w, eps):
    # [.., n] float32: x / rms(x) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(positions, rotary_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    ang = positions.double()[:, None] * inv[None, :]          # [T, rd/2]
    emb = torch.cat([ang, ang], dim=-1)                          # [T, rd] NeoX halves
    return emb.cos().float(), emb.sin().float()


def apply_rope(x, cos, sin, rotary_dim):
    # x [T, heads, hd]; NeoX rotate-half on the first rotary_dim dims, the rest pass through
    r, p = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rot = torch.cat([-r[..., half:], r[..., :half]], dim=-1)
    return torch.cat([r * cos[:, None, :] + rot * sin[:, None, :], p], dim=-1)


# The architectures routed by sigmoid + correction bias with shared experts and dense-first
# layers (MODELS.md): GLM-4.x, DeepSeek-V3, GLM-5. Qwen3-MoE is the softmax one.
SIGMOID_ROUTED = ("glm4_moe", "deepseek_v3", "glm_moe_dsa")


def is_glm(c):
    return c["model_type"] in SIGMOID_ROUTED


def layer_is_moe(c, L):
    if is_glm(c):
        return L >= c.get("first_k_dense_replace", 0)
    step = c.get("decoder_sparse_step", 1)
    return L not in c.get("mlp_only_layers", []) and (L + 1) % step == 0


def route(c, logits, bias):
    """Expert choice as MODELS.md: returns ids [T, k], weights [T, k], sel [T, E] selection keys
    (sigmoid: biased scores, masked experts -inf; softmax: log-probabilities), group margin [T]
    or None."""
    k = c["num_experts_per_tok"]
    if is_glm(c):
        s = logits.sigmoid()
        sel = s + bias[None, :] if bias is not None else s.clone()
        ng, tg = c.get("n_group", 1), c.get("topk_group", 1)
        gmargin = None
        if ng > 1:
            E = sel.shape[1]
            gs = sel.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)   # [T, ng]
            order = gs.sort(dim=-1, descending=True)[0]
            gmargin = order[:, tg - 1] - order[:, tg]
            keep = gs.topk(tg, dim=-1)[1]
            mask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
            sel = sel.masked_fill(~mask.repeat_interleave(E // ng, dim=1), float("-inf"))
        ids = sel.topk(k, dim=-1)[1]
        w = s.gather(1, ids)
        if c.get("norm_topk_prob", True):
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return ids, w * c.get("routed_scaling_factor", 1.0), sel, gmargin
    p = torch.softmax(logits, dim=-1)
    ids = p.topk(k, dim=-1)[1]
    w = p.gather(1, ids)
    if c.get("norm_topk_prob", True):
        w = w / w.sum(-1, keepdim=True)
    # selection keys in logit units (log-probabilities: the same order as p, and margins that
    # do not shrink with the number of experts)
    return ids, w, torch.log_softmax(logits, dim=-1), None


def top_k_margin(sel, k):
    """[T] selection key of the k-th choice minus the (k+1)-th (masked experts are -inf)."""
    v = sel.sort(dim=-1, descending=True)[0]
    return v[:, k - 1] - v[:, k]


@torch.no_grad()
def forward(t, c, ids, bf16_between_ops=False, forced_ids=None, embed_noise=0.0, noise_seed=0,
            fp32_residual=False):
    """t: HF-named tensors; ids: list of token ids (one sequence). forced_ids: {layer: [T, k]}
    replaces the router's choice (weights still from the unforced scores of those experts).
    bf16_between_ops: every op's output rounded to bf16 (fp32 inside ops), as a bf16 engine;
    fp32_residual: ... except the residual stream, kept in fp32 (an emulated alternative)."""
    f = lambda name: t[name].float()
    rd = (lambda v: v.bfloat16().float()) if bf16_between_ops else (lambda v: v)
    rr = (lambda v: v) if fp32_residual else rd  # rounding of the residual additions
    hd = c["head_dim"]
    nh, nkv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    T = len(ids)
    rope = c.get("rope_parameters") or {}
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    prf = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    rotary_dim = int(round(hd * prf))
    cos, sin = rope_tables(torch.arange(T), rotary_dim, theta)
    x = f("model.embed_tokens.weight")[torch.tensor(ids)]                    # [T, H]
    if embed_noise > 0:
        g = torch.Generator().manual_seed(noise_seed)
        x = x * (1.0 + embed_noise * torch.randn(x.shape, generator=g))
    causal = torch.full((T, T), float("-inf")).triu(1)                        # [T, T]
    routes = []

    def lin(name, v):
        y = v @ f(name + ".weight").T
        if name + ".bias" in t:
            y = y + f(name + ".bias")
        return rd(y)

    def mlp(p, v):
        return lin(p + "down_proj", rd(torch.nn.functional.silu(lin(p + "gate_proj", v)) * lin(p + "up_proj", v)))

    for L in range(c["num_hidden_layers"]):
        p = f"model.layers.{L}."
        a = rd(rms_norm(x, f(p + "input_layernorm.weight"), eps))
        q = lin(p + "self_attn.q_proj", a).view(T, nh, hd)
        k = lin(p + "self_attn.k_proj", a).view(T, nkv, hd)
        v = lin(p + "self_attn.v_proj", a).view(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in t:
            q = rd(rms_norm(q, f(p + "self_attn.q_norm.weight"), eps))
            k = rd(rms_norm(k, f(p + "self_attn.k_norm.weight"), eps))
        q, k = rd(apply_rope(q, cos, sin, rotary_dim)), rd(apply_rope(k, cos, sin, rotary_dim))
        rep = nh // nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)   # [T, nh, hd]
        s = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5 + causal
        o = rd(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v).reshape(T, nh * hd))
        x = rr(x + lin(p + "self_attn.o_proj", o))
        m = rd(rms_norm(x, f(p + "post_attention_layernorm.weight"), eps))
        if not layer_is_moe(c, L):
            x = rr(x + mlp(p + "mlp.", m))
            continue
        logits = m @ f(p + "mlp.gate.weight").T                                # [T, E] f32
        bias = t.get(p + "mlp.gate.e_score_correction_bias")
        eids, w, sel, gmargin = route(c, logits, None if bias is None else bias.float())
        if forced_ids is not None and L in forced_ids:
            eids = forced_ids[L]
            w = (logits.sigmoid() if is_glm(c) else torch.softmax(logits, -1)).gather(1, eids)
            w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.get("routed_scaling_factor", 1.0)
        routes.append({"layer": L, "sel": sel, "ids": eids, "group_margin": gmargin})
        y = torch.zeros_like(m)
        for j in range(eids.shape[1]):
            for e in eids[:, j].unique().tolist():
                rows = (eids[:, j] == e).nonzero()[:, 0]
                y[rows] += w[rows, j:j + 1] * mlp(p + f"mlp.experts.{e}.", m[rows])
        if p + "mlp.shared_experts.gate_proj.weight" in t:
            y = y + mlp(p + "mlp.shared_experts.", m)
        x = rr(x + rd(y))
    h = rms_norm(x, f("model.norm.weight"), eps)
    head = "lm_head.weight" if "lm_head.weight" in t else "model.embed_tokens.weight"  # tied
    return rd(h) @ f(head).T, routes
