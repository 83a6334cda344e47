"""The tensor table and the memory arithmetic at GLM-5's real size (config values from zai-org/GLM-5's config.json):
1809 GGUF tensors with the MTP block, 743.9B parameters without it, 753.9B with it."""
from glm5_shim.report import kv_cache_bytes_per_token
from glm5_shim.gguf.tensor_map import ROLE_MTP, build_tensor_map

GLM5 = dict(hidden_size=6144, vocab_size=154880, num_attention_heads=64, q_lora_rank=2048, kv_lora_rank=512,
            qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, index_n_heads=32, index_head_dim=128,
            n_routed_experts=256, moe_intermediate_size=2048, n_shared_experts=1, intermediate_size=12288,
            first_k_dense_replace=3, moe_layer_freq=1, num_hidden_layers=78, num_nextn_predict_layers=1)


def _params(specs) -> int:
    total = 0
    for spec in specs:
        n = 1
        for d in spec.shape:
            n *= d
        total += n
    return total


def test_tensor_count_and_parameters():
    tmap = build_tensor_map(GLM5, include_mtp=True)
    # what llama.cpp writes: no legacy attn_kv_b, no optional nextn embed/head copies
    written = [s for s in tmap if s.required or s.gguf_name == "output.weight"]
    assert len(written) == 1809
    main = [s for s in written if s.role != ROLE_MTP and not s.gguf_name.endswith("attn_kv_b.weight")]
    assert round(_params(main) / 1e9, 1) == 743.9
    assert round(_params(written) / 1e9, 1) == 753.9


def test_kv_cache_bytes_per_token():
    kv = kv_cache_bytes_per_token(GLM5)
    assert kv["total_bf16"] == 78 * (576 * 2 + 132) == 100152
    assert kv["total_fp8_ds_mla"] == 78 * (656 + 132) == 61464
