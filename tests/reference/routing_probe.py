"""Router choices and top-k margins of a transformers MoE model, through forward hooks.

A hook on every `mlp.gate` module keeps the router's input (the post-attention-normed hidden
state). The scores are then recomputed the way that transformers' router computes them:
Glm4Moe (and DeepseekV3, GlmMoeDsa) cast input and weight to float32; Qwen3Moe multiplies in the model's dtype (bf16 router
logits in a bf16 model) and takes the softmax in float32. Selection follows MODELS.md
(local_forward.route): sigmoid + correction bias, group-limited top-k, or softmax top-k.

Margin of a row = min over MoE layers of (k-th best selection key - (k+1)-th), and for grouped
routing also the kept-group score minus the best dropped group's: a margin below the scores'
rounding noise means the expert set can change under any rounding difference.
"""
import torch
import torch.nn.functional as F

from local_forward import is_glm, route, top_k_margin


class RouterProbe:
    def __init__(self, model, config):
        self.c = config
        self.glm = is_glm(config)
        self.inputs = {}   # layer -> [T, H] router input of the last forward
        self.handles = []
        self.gates = {}    # layer -> router module
        for L, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None:
                continue  # a dense layer (its MLP has gate_proj, no router)
            self.gates[L] = gate
            self.handles.append(gate.register_forward_hook(self._hook(L), with_kwargs=True))

    def _hook(self, L):
        def fn(module, args, kwargs, output):
            x = args[0] if args else next(iter(kwargs.values()), None)
            if torch.is_tensor(x):  # otherwise the layer is left out of the margins
                self.inputs[L] = x.detach().reshape(-1, x.shape[-1])
        return fn

    def routes(self):
        """{layer: (ids [T, k], sel [T, E], group_margin [T] or None)} of the last forward."""
        out = {}
        inputs, self.inputs = self.inputs, {}
        for L, x in sorted(inputs.items()):
            g = self.gates[L]
            if self.glm:
                logits = F.linear(x.float(), g.weight.float())
                bias = getattr(g, "e_score_correction_bias", None)
                bias = None if bias is None else bias.float()
            else:
                logits = F.linear(x, g.weight).float()
                bias = None
            ids, _, sel, gm = route(self.c, logits, bias)
            out[L] = (ids, sel, gm)
        return out

    def close(self):
        for h in self.handles:
            h.remove()


def row_margins(routes, k):
    """[T] minimum top-k (and group) margin over the MoE layers; None when there is no MoE layer."""
    m = None
    for ids, sel, gm in routes.values():
        r = top_k_margin(sel, k)
        if gm is not None:
            r = torch.minimum(r, gm)
        m = r if m is None else torch.minimum(m, r)
    return m


def flips(a, b):
    """[T] bool: the expert SET differs between two routes dicts in any layer."""
    f = None
    for L in a:
        ia, ib = a[L][0].sort(dim=-1)[0], b[L][0].sort(dim=-1)[0]
        d = (ia != ib).any(dim=-1)
        f = d if f is None else f | d
    return f
