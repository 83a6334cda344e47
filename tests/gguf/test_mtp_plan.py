"""The MTP draft's side of one GGUF, from headers only: the draft's load plan (the MTP block, nothing else), the
target's plan skipping that block, the one line for a file that cannot serve the draft (what launch.sh's preflight
prints for --speculative-config), and what inspect / doctor say about the layer."""
from __future__ import annotations

import json

import pytest

from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.load_plan import MTP_FLAG, mtp_draft_problem, plan_load, plan_tensors
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.report import format_report, inspect_report
from glm5_shim.gguf.tensor_map import ROLE_FORCE_FLOAT, ROLE_FROM_TARGET, build_tensor_map, mtp_param_name
from glm5_shim.gguf.type_policy import DEQUANTIZE, FLOAT, KEEP, KV_B, SKIP, skip_reason
from glm5_shim.gguf.validate import ERROR, WARNING, validate
from glm5_shim.preflight import main as preflight_main, problem

SPEC = json.dumps({"method": "mtp", "num_speculative_tokens": 2})


def _plans(tiny_model):
    model = open_gguf(tiny_model.path)
    config = build_hf_config(model)
    return model, config, plan_load(model, config), plan_load(model, config, draft=True)


def test_the_draft_loads_the_mtp_block_and_the_target_skips_it(small):
    model, config, target, draft = _plans(small("mtp-q8", quant="Q8_0"))
    layer = config["num_hidden_layers"]
    mtp = {t.gguf_name for t in target.tensors if t.gguf_name.startswith(f"blk.{layer}.")}
    assert len(mtp) == 27 and all(t.action == SKIP for t in target.tensors if t.gguf_name in mtp)
    loaded = {t.gguf_name: t.action for t in draft.tensors if t.action != SKIP}
    assert set(loaded) == mtp  # the block, and nothing of the trunk, the embedding or lm_head
    assert loaded[f"blk.{layer}.nextn.eh_proj.weight"] == DEQUANTIZE  # vLLM: a plain torch Linear
    assert loaded[f"blk.{layer}.attn_q_b.weight"] == KEEP and loaded[f"blk.{layer}.attn_k_b.weight"] == KV_B
    assert loaded[f"blk.{layer}.nextn.enorm.weight"] == FLOAT
    assert draft.draft and not target.draft
    assert draft.notes == [f"MTP draft: loading 27 tensors of the multi-token-prediction block blk.{layer} "
                           "(embedding and lm_head shared with the target model)"]
    assert any(n.startswith(f"skipping 27 tensors of the multi-token-prediction block blk.{layer} in the target "
                            f"model ({MTP_FLAG}") for n in target.notes)


def test_the_drafts_unquantized_modules_are_its_checkpoint_prefixes(small):
    """vLLM builds the MTP block's modules under the checkpoint names (model.layers.N.self_attn..., no mtp_block):
    those are what its GGUF quant config matches; float fused groups are also named as the fused module."""
    _, config, target, draft = _plans(small("mtp-q8", quant="Q8_0"))
    layer = config["num_hidden_layers"]
    modules = draft.unquantized_modules()
    assert f"model.layers.{layer}.self_attn.kv_b_proj" in modules and f"model.layers.{layer}.eh_proj" in modules
    assert all(m.startswith(f"model.layers.{layer}.") and ".mtp_block." not in m for m in modules)
    assert not any(m.startswith(f"model.layers.{layer}.") for m in target.unquantized_modules())
    *_, bf16_draft = _plans(small("mtp-bf16", quant="BF16"))
    bf16 = bf16_draft.unquantized_modules()
    for fused in ("self_attn.fused_qkv_a_proj", "mlp.shared_experts.gate_up_proj"):
        assert f"model.layers.{layer}.{fused}" in bf16


def test_the_table_roles_of_the_mtp_only_tensors(small):
    config = build_hf_config(open_gguf(small("mtp-q8", quant="Q8_0").path))
    table = build_tensor_map(config)
    n = config["num_hidden_layers"]
    assert table[f"blk.{n}.nextn.eh_proj.weight"].base_role == ROLE_FORCE_FLOAT
    for name in ("embed_tokens", "shared_head_head"):
        spec = table[f"blk.{n}.nextn.{name}.weight"]
        assert spec.base_role == ROLE_FROM_TARGET and not spec.required
        assert skip_reason(spec, draft=True) is not None and skip_reason(spec) is not None
    assert table[f"blk.{n}.attn_q_b.weight"].param_name == f"model.layers.{n}.mtp_block.self_attn.q_b_proj.weight"
    assert table["blk.0.attn_q_b.weight"].param_name == "model.layers.0.self_attn.q_b_proj.weight"
    assert mtp_param_name(f"model.layers.{n}.embed_tokens.weight", n) == "model.embed_tokens.weight"
    assert mtp_param_name(f"model.layers.{n}.shared_head.norm.weight", n) == f"model.layers.{n}.shared_head.norm.weight"


@pytest.mark.parametrize("name, kwargs, fragments", [
    ("no-mtp", {"split_mtp": "trunk"}, ["glm-dsa.nextn_predict_layers is absent", "--no-mtp writes"]),
    ("zero-nextn", {"mtp": False}, ["glm-dsa.nextn_predict_layers is 0)"]),
    ("stripped", {"split_mtp": "stripped"}, ["nextn_predict_layers is 1 but the MTP layer blk.2 has no tensors"]),
    ("quantized-enorm", {"overrides": {"blk.2.nextn.enorm.weight": "Q8_0"}},
     ["tensor blk.2.nextn.enorm.weight: type Q8_0 is not allowed", "(the MTP draft's layer blk.2; without "
      "--speculative-config the model serves without it)"]),
    ("missing-hnorm", {"tensor_hook": lambda n, a: None if n == "blk.2.nextn.hnorm.weight" else a},
     ["tensor blk.2.nextn.hnorm.weight of the MTP layer is missing", "model.layers.2.hnorm.weight"]),
    ("missing-v_b", {"tensor_hook": lambda n, a: None if n == "blk.2.attn_v_b.weight" else a},
     ["tensor blk.2.attn_v_b.weight is missing", "to rebuild kv_b_proj"]),
])
def test_a_file_that_cannot_serve_the_draft_is_one_line(small, capsys, name, kwargs, fragments):
    """...while the target model serves from it: the validator has at most warnings there."""
    m = small(f"mtp-bad-{name}", quant="Q8_0", write_reference=False, **kwargs)
    model = open_gguf(m.path)
    config = build_hf_config(model)
    line = mtp_draft_problem(model, config)
    assert line is not None and "\n" not in line and line.startswith(f"{m.path}: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert not [f for f in validate(m.path) if f.level == ERROR]
    plan_load(model, config)  # the target's plan
    assert problem(str(m.path)) is None and problem(str(m.path), SPEC) == line
    assert preflight_main([str(m.path), "--speculative-config", SPEC]) == 2
    assert capsys.readouterr().err == line + "\n"
    if name not in ("no-mtp", "zero-nextn", "stripped"):
        with pytest.raises(GGUFError):
            plan_load(model, config, draft=True)


@pytest.mark.parametrize("spec", [
    SPEC, {"method": "deepseek_mtp", "num_speculative_tokens": 1},  # vLLM's deprecated alias
    {"method": "mtp", "model": "{path}"}, {"model": "{path}", "num_speculative_tokens": 1},  # vLLM infers mtp
])
def test_every_way_of_asking_for_the_files_mtp_draft_is_checked(small, spec):
    path = str(small("mtp-bad-no-mtp", quant="Q8_0", write_reference=False, split_mtp="trunk").path)
    if isinstance(spec, dict):
        spec = json.loads(json.dumps(spec).replace("{path}", path))
    assert "no multi-token-prediction" in problem(path, spec)


@pytest.mark.parametrize("spec", [
    None, '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
    '{"method": "suffix"}', "not json", '["mtp"]'])
def test_other_speculative_configs_are_vllms_business(small, spec):
    path = str(small("mtp-bad-no-mtp", quant="Q8_0", write_reference=False, split_mtp="trunk").path)
    assert problem(path, spec) is None


def test_a_file_with_its_mtp_layer_passes(small, capsys):
    path = str(small("mtp-q8", quant="Q8_0").path)
    assert problem(path, SPEC) is None
    assert preflight_main([path, "--speculative-config", SPEC]) == 0
    assert capsys.readouterr() == ("", "")


def test_inspect_and_doctor_say_whether_the_file_has_an_mtp_layer(small):
    good = inspect_report(small("mtp-q8", quant="Q8_0").path)
    mtp = good["mtp"]
    assert mtp["available"] and mtp["problem"] is None and mtp["layers"] == [2] and mtp["tensors"] == 27
    assert mtp["flag"] == MTP_FLAG == """--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'"""
    # the draft's weights: more than the block's file bytes (eh_proj, kv_b, the indexer's wk become float), less
    # split over more GPUs; its own KV cache is one layer's MLA latent and indexer keys
    per_gpu = {int(tp): b for tp, b in mtp["weight_bytes_per_gpu"].items()}
    assert per_gpu[1] > mtp["file_bytes"] and per_gpu[1] > per_gpu[2] > per_gpu[8]
    assert mtp["kv_cache_bytes_per_token"] == {"bf16": 1152 + 132, "fp8_ds_mla": 656 + 132}
    text = format_report(good)
    assert "MTP layer blk.2: 27 tensors" in text and f"enable with {MTP_FLAG}" in text
    # what the target loads is unchanged by the layer's presence
    assert good["weight_bytes_per_gpu"] == inspect_report(small("mtp-bad-stripped", quant="Q8_0",
                                                                write_reference=False,
                                                                split_mtp="stripped").path)["weight_bytes_per_gpu"]
    for name, kwargs in (("no-mtp", {"split_mtp": "trunk"}), ("stripped", {"split_mtp": "stripped"})):
        bad = inspect_report(small(f"mtp-bad-{name}", quant="Q8_0", write_reference=False, **kwargs).path)
        assert not bad["mtp"]["available"] and "weight_bytes_per_gpu" not in bad["mtp"]
        assert f"MTP speculative decoding: unavailable: {bad['mtp']['problem']}" in format_report(bad)
    assert [f.level for f in validate(small("mtp-bad-stripped", quant="Q8_0", write_reference=False,
                                            split_mtp="stripped").path)] == [WARNING]


def test_the_draft_plan_ignores_what_the_targets_refuses(small):
    """A stray tensor outside the glm-dsa layout is the target's error, not the draft's."""
    import numpy as np

    m = small("mtp-stray", quant="Q8_0", write_reference=False,
              extra_tensors={"blk.0.stray.weight": np.zeros(32, np.float32)})
    model = open_gguf(m.path)
    config = build_hf_config(model)
    assert plan_tensors(model, config).refused and not plan_tensors(model, config, draft=True).refused


def test_pipeline_parallelism_is_refused_with_a_draft(small):
    from glm5_shim.loading.mtp import mtp_problem

    path = str(small("mtp-q8", quant="Q8_0").path)
    assert mtp_problem("mtp", None, path) is None
    line = mtp_problem("mtp", None, path, pipeline_parallel_size=2)
    assert line.startswith(f"{path}: an MTP draft of a GGUF needs --pipeline-parallel-size 1, found 2"), line
    assert mtp_problem("ngram", None, path, pipeline_parallel_size=2) is None
