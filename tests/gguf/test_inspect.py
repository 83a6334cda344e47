"""inspect: report contents, memory numbers that hang together, the command line."""

from __future__ import annotations

import json

from glm5_shim import report as gguf_inspect
from glm5_shim.gguf.reader import open_gguf


def test_report_contents(q8):
    report = gguf_inspect.inspect_report(q8.path)
    model = open_gguf(q8.path)
    assert report["architecture"] == "glm-dsa"
    assert report["config"] == q8.config
    assert report["tensor_count"] == len(model.tensors) == 94
    # as llama.cpp's converter writes a Q8_0 file: indexer.proj stays F32 in each of the 4 blocks (3 + MTP)
    assert report["tensor_types"] == {"F32": 34 + 4, "Q8_0": 60 - 4}
    assert sum(report["tensor_bytes_by_type"].values()) == sum(t.n_bytes for t in model)
    assert report["findings"] == []
    assert report["roles"]["mtp"] == 27
    json.dumps(report)  # plain data


def test_weight_memory_is_consistent(q8):
    report = gguf_inspect.inspect_report(q8.path)
    per_gpu = {int(k): v for k, v in report["weight_bytes_per_gpu"].items()}
    assert per_gpu[8] < per_gpu[4] < per_gpu[2] < per_gpu[1]
    # bytes(TP) = replicated + sharded / TP  →  solve from TP1 and TP2, then predict TP4 and TP8.
    sharded = 2 * (per_gpu[1] - per_gpu[2])
    replicated = per_gpu[1] - sharded
    for tp in (4, 8):
        assert abs(per_gpu[tp] - (replicated + sharded / tp)) <= 1
    model = open_gguf(q8.path)
    # Experts are sharded; replicated weights include the indexer and q_a/kv_a projections.
    assert report["experts_bytes"] <= sharded
    indexer_bf16 = sum(2 * t.n_elements for t in model if t.name.startswith("blk.0.indexer."))
    assert replicated >= indexer_bf16
    # The MTP block is not counted: TP1 is below the file's total tensor bytes plus the float upcasts.
    non_mtp_quantized = sum(t.n_bytes for t in model if not t.name.startswith("blk.3.") and t.type_name == "Q8_0"
                            and ".indexer.attn_k." not in t.name and ".indexer.proj." not in t.name
                            and "_k_b." not in t.name and "_v_b." not in t.name)
    assert per_gpu[1] > non_mtp_quantized
    assert report["mtp_bytes"] == sum(t.n_bytes for t in model if t.name.startswith("blk.3."))


def test_kv_cache_per_token(q8):
    kv = gguf_inspect.inspect_report(q8.path)["kv_cache_bytes_per_token"]
    assert kv["mla_bf16_per_layer"] == 576 * 2
    assert kv["mla_fp8_ds_mla_per_layer"] == 656
    assert kv["indexer_per_layer"] == 132
    assert kv["total_bf16"] == 3 * (1152 + 132) and kv["total_fp8_ds_mla"] == 3 * (656 + 132)


def test_glm5_sized_config_numbers():
    config = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "num_hidden_layers": 78}
    kv = gguf_inspect.kv_cache_bytes_per_token(config)
    assert kv["total_bf16"] == 78 * 1284 and kv["total_fp8_ds_mla"] == 78 * 788


def test_format_and_cli(q8, tmp_path, capsys):
    text = gguf_inspect.format_report(gguf_inspect.inspect_report(q8.path))
    for fragment in ("architecture: glm-dsa", "TP1:", "TP8:", "fp8_ds_mla", "Q8_0 x56", "0 error(s)"):
        assert fragment in text
    assert gguf_inspect.main([str(q8.path)]) == 0
    assert "TP8:" in capsys.readouterr().out
    assert gguf_inspect.main([str(q8.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensor_count"] == 94
    bad = tmp_path / "bad.gguf"
    bad.write_text("nope")
    assert gguf_inspect.main([str(bad)]) == 1
    assert "not a GGUF" in capsys.readouterr().out
