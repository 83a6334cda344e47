"""Weight bytes of a slice by the groups the projection needs (bench/projection.py splits the measured GGUF-dense
time by these bytes: decode reads every weight once a step, so a bandwidth-bound kernel's time follows its bytes)."""
from __future__ import annotations

import re

FLOAT_TYPES = ("F32", "F16", "BF16")
# llama.cpp tensors that vLLM 0.23 does not run as GGUF matmuls (the shim dequantizes them or vLLM rebuilds them):
# k_b/v_b become kv_b_proj (MLA's absorbed bmm), the indexer's k and weights projections are built unquantized
_NOT_GGUF_MATMUL = re.compile(r"attn_k_b|attn_v_b|attn_kv_b|indexer\.attn_k\.|indexer\.proj\.")


def weight_groups(tensors, layers: int, dense_layers: int) -> dict:
    """tensors: (name, type_name, nbytes) triples. Returns bytes per group, per layer where the group is per layer:
    routed_per_moe_layer, shared_expert_per_moe_layer, dense_ffn_per_dense_layer, attn_gguf_per_layer (attention
    and indexer projections run as GGUF matmuls), attn_other_per_layer (the rest of a layer's attention weights),
    router_per_moe_layer, lm_head, embedding, norms (all float norm weights), total."""
    g = dict.fromkeys(("routed", "shared", "dense_ffn", "attn_gguf", "attn_other", "router", "norms", "lm_head",
                       "embedding"), 0)
    total = 0
    for name, type_name, nbytes in tensors:
        total += nbytes
        if name == "output.weight":
            g["lm_head"] += nbytes
        elif name == "token_embd.weight":
            g["embedding"] += nbytes
        elif not name.startswith("blk."):
            g["norms"] += nbytes
        elif "_exps." in name:
            g["routed"] += nbytes
        elif "_shexp." in name:
            g["shared"] += nbytes
        elif "ffn_gate_inp" in name or "exp_probs_b" in name:
            g["router"] += nbytes
        elif re.search(r"ffn_(gate|up|down)\.weight", name):
            g["dense_ffn"] += nbytes
        elif type_name in FLOAT_TYPES and name.endswith(("norm.weight", "norm.bias")):
            g["norms"] += nbytes
        elif type_name in FLOAT_TYPES or _NOT_GGUF_MATMUL.search(name):
            g["attn_other"] += nbytes
        else:
            g["attn_gguf"] += nbytes
    moe = max(layers - dense_layers, 0)
    per = lambda v, n: round(v / n) if n else 0
    return {"layers": layers, "dense_layers": dense_layers, "moe_layers": moe,
            "routed_per_moe_layer": per(g["routed"], moe), "shared_expert_per_moe_layer": per(g["shared"], moe),
            "router_per_moe_layer": per(g["router"], moe),
            "dense_ffn_per_dense_layer": per(g["dense_ffn"], dense_layers),
            "attn_gguf_per_layer": per(g["attn_gguf"], layers), "attn_other_per_layer": per(g["attn_other"], layers),
            "lm_head": g["lm_head"], "embedding": g["embedding"], "norms": g["norms"], "total": total}


def plan_groups(layers: int, dense_layers: int, preset: str, rank_of: int) -> dict:
    """weight_groups of the slice make-slice writes for these arguments (no file needed)."""
    from glm5_shim.gguf.slice.plan import plan_slice

    plan = plan_slice(layers, dense_layers, preset, rank_of=rank_of)
    return weight_groups([(t.name, t.type_name, t.nbytes) for t in plan.tensors], layers, dense_layers)
