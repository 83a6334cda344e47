"""vLLM builds its ModelConfig, tokenizer, chat template and generation config from a glm-dsa GGUF alone;
--hf-config-path and --tokenizer still win; bad files stop with one line naming the file and the problem."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from glm5_shim.gguf.fixture import make_tiny, reference_dir
from tests.helpers import REPO, child_env

TEXTS = ["Hello world, GLM-5 says 12345!", "  spaces\n\ttabs  ", "héllo wörld ✓ 漢字", "def f(x):\n    return x**2",
         "<|user|>hi<|assistant|>"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-config")
    good = make_tiny(root / "good.gguf", quant="Q4_K", layers=2)[0]
    split = make_tiny(root / "split.gguf", quant="Q8_0", layers=2, shards=3)
    override_dir = root / "hf-config"
    override_dir.mkdir()
    config = json.loads((reference_dir(good) / "config.json").read_text())
    config["max_position_embeddings"] = 1024  # distinguishable from the GGUF's 8192
    (override_dir / "config.json").write_text(json.dumps(config))
    # bad inputs
    not_gguf = root / "not-a-model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    truncated = root / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:-4096])
    missing_dir = root / "missing"
    missing_dir.mkdir()
    for p in split[:2]:
        shutil.copy(p, missing_dir / p.name)
    wrong_shape = make_tiny(root / "shape.gguf", layers=2, write_reference=False,
                            tensor_hook=lambda n, a: a[:, :, :128] if n == "blk.1.ffn_down_exps.weight" else a)[0]
    contradiction = make_tiny(root / "meta.gguf", layers=2, write_reference=False,
                              metadata_overrides={"glm-dsa.attention.q_lora_rank": 128})[0]
    unsupported = make_tiny(root / "mxfp4.gguf", layers=2, write_reference=False,
                            overrides={"blk.1.ffn_down_exps.weight": "MXFP4"})[0]
    q8 = make_tiny(root / "q8.gguf", quant="Q8_0", layers=2, write_reference=False)[0]
    cases = {
        "good": {"model": str(good)},
        "tp2_q8": {"model": str(q8), "tensor_parallel_size": 2},
        "tp2_q4k": {"model": str(good), "tensor_parallel_size": 2},
        "split": {"model": str(split[0])},
        "hf_config_path": {"model": str(good), "hf_config_path": str(override_dir)},
        "tokenizer": {"model": str(good), "tokenizer": str(reference_dir(good))},
        "not_gguf": {"model": str(not_gguf)},
        "truncated": {"model": str(truncated)},
        "missing_shard": {"model": str(missing_dir / split[0].name)},
        "wrong_shape": {"model": str(wrong_shape)},
        "contradiction": {"model": str(contradiction)},
        "unsupported": {"model": str(unsupported)},
    }
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), "configs",
                           json.dumps(list(cases.values()))], env=child_env(), capture_output=True, text=True,
                          timeout=1200, cwd=str(REPO))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(cases), proc.stderr[-4000:]
    out = dict(zip(cases, lines))
    out["_paths"] = {"good": good, "split": split, "missing": missing_dir / split[2].name}
    return out


def test_a_tensor_parallel_size_that_would_cut_quantized_blocks_is_refused(results):
    """Q8_0 (32-value blocks) splits at TP 2; the Q4_K file's expert down projections have rows of 256 values = one
    block, which vLLM would cut in two bytewise: refused in the front end, naming the first such tensor in the
    file's (llama.cpp's) order, with the sizes that work."""
    assert results["tp2_q8"]["ok"], results["tp2_q8"]
    bad = results["tp2_q4k"]
    assert not bad["ok"] and bad["error"].startswith("GGUFError: glm5-shim: ")
    assert "good.gguf: tensor blk.1.ffn_down_exps.weight (Q4_K, 256 values a block) cannot be split for " \
           "--tensor-parallel-size 2: each row is 1 block(s)" in bad["error"]
    assert bad["error"].endswith("this file splits cleanly at --tensor-parallel-size 1")
    assert "create_engine_config" in bad["frames"] and "\n" not in bad["error"]


def test_config_and_tokenizer_come_from_the_gguf(results):
    from tokenizers import Tokenizer

    good = results["good"]
    assert good["ok"], good
    assert good["model_type"] == "glm_moe_dsa" and good["quantization"] == "gguf"
    assert good["max_model_len"] == 8192 and good["index_topk"] == 128
    reference = Tokenizer.from_file(str(reference_dir(results["_paths"]["good"]) / "tokenizer.json"))
    assert good["ids"] == [reference.encode(t, add_special_tokens=False).ids for t in TEXTS]
    # GLM-5's template: the generation prompt opens the reasoning block
    assert good["chat"].startswith("[gMASK]<sop><|user|>") and good["chat"].endswith("<|assistant|><think>")
    vocab = reference.get_vocab()
    assert good["eos"] == [vocab["<|endoftext|>"], vocab["<|user|>"], vocab["<|observation|>"]]


def test_split_gguf_builds_the_same_config(results):
    assert results["split"]["ok"], results["split"]
    assert results["split"]["model_type"] == "glm_moe_dsa"


def test_hf_config_path_and_tokenizer_still_win(results):
    assert results["hf_config_path"]["ok"], results["hf_config_path"]
    assert results["hf_config_path"]["max_model_len"] == 1024
    assert results["tokenizer"]["ok"], results["tokenizer"]
    assert results["tokenizer"]["tokenizer"] == str(reference_dir(results["_paths"]["good"]))
    assert results["tokenizer"]["ids"] == results["good"]["ids"]


@pytest.mark.parametrize("case, fragments", [
    ("not_gguf", ["not-a-model.gguf", "not a GGUF"]),
    ("truncated", ["truncated.gguf", "truncated"]),
    ("missing_shard", ["missing shard 3 of 3"]),
    ("wrong_shape", ["blk.1.ffn_down_exps.weight", "[8, 256, 128]"]),
    ("contradiction", ["glm-dsa.attention.q_lora_rank", "blk.0.attn_q_a.weight"]),
    ("unsupported", ["blk.1.ffn_down_exps.weight", "MXFP4"]),
])
def test_bad_gguf_stops_with_one_line(results, case, fragments):
    res = results[case]
    assert not res["ok"], res
    # pydantic wraps ModelConfig's errors ("Value error, ..."); the shim's own line is what the user reads
    shim_lines = [line for line in res["error"].splitlines() if all(f in line for f in fragments)]
    assert len(shim_lines) == 1, (case, res["error"])
    assert "create_model_config" in res["frames"]
