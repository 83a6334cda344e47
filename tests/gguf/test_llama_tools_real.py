"""The real llama.cpp tools against the project's imitation of them, and their files through the shim's loader.

llama.cpp's `convert_hf_to_gguf.py` (from the pinned llama-cpp-python sdist, bench/real_gguf.py) converts the tiny
model's HF checkpoint to BF16, F16 and Q8_0 GGUFs: `make_tiny` must write the same tensors, in the same order, with
the same types and the same metadata keys; and vLLM, through the shim, must load the converter's files to the
values they store.  llama-quantize's presets are checked the same way, the very low-bit ones (IQ1_S … IQ3_M) made
with llama-imatrix's importance matrix: CI builds both tools from the same sdist (bench/real_gguf.py
--build-tools, ~4 min); elsewhere LLAMA_QUANTIZE / LLAMA_IMATRIX or that cached build, else those tests skip.

CI must run the converter: there (CI or GLM5_SHIM_CI set; .ci/run sets the latter) a missing sdist fails;
elsewhere it skips with the reason.
"""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from glm5_shim.gguf.fixture import make_tiny
from glm5_shim.gguf.llama_tools import QUANTIZE_PRESETS, quantize_types
from tests.helpers import LLAMA_REAL_OUTTYPES, LLAMA_REAL_PRESETS, bench_module, in_ci, load_in_cpu_harness

IMATRIX_PRESETS = bench_module("real_gguf").IMATRIX_PRESETS


def main_type(name: str) -> str:
    """A real file's main type: the converter's outtype, or the type most of a preset's tensors get."""
    return QUANTIZE_PRESETS.get(name) or IMATRIX_PRESETS.get(name) or name


def _layout(path) -> tuple[list, list]:
    reader = gguf.GGUFReader(str(path))
    tensors = [(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in reader.tensors]
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    return tensors, keys


def _values(path, keys) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: reader.fields[k].contents() for k in keys}


def converter_fills_in_indexer_types(checkpoint) -> bool:
    """Whether llama.cpp's converter will write glm-dsa.attention.indexer.types for a GLM-5 checkpoint whose
    config.json has no indexer_types: it reads the config through transformers' AutoConfig where transformers knows
    the model type (else config.json as it is), and transformers' GlmMoeDsaConfig (5.x; 5.25 is what pip resolves
    for vLLM 0.23 since December 2026, 4.57 before) fills in indexer_types, all "full"."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(checkpoint)).to_dict().get("indexer_types") is not None
    except (ValueError, KeyError, OSError):   # transformers 4.57: no glm_moe_dsa
        return False


@pytest.mark.parametrize("outtype", LLAMA_REAL_OUTTYPES)
def test_make_tiny_writes_what_the_converter_writes(llama_real, outtype, tmp_path):
    from glm5_shim.gguf.fixture import reference_dir

    root, files = llama_real
    layers = int(gguf.GGUFReader(str(files[outtype])).fields["glm-dsa.block_count"].contents())
    filled = converter_fills_in_indexer_types(reference_dir(root / "source.gguf"))
    ours = make_tiny(tmp_path / "ours.gguf", quant=outtype, seed=0, write_reference=False,
                     **({"indexer_types": "F" * (layers - 1)} if filled else {}))[0]   # the MTP layer has none
    real_tensors, real_keys = _layout(files[outtype])
    our_tensors, our_keys = _layout(ours)
    assert [t[0] for t in our_tensors].index("blk.0.attn_kv_a_mqa.weight") < \
        [t[0] for t in our_tensors].index("blk.0.attn_q_a.weight")  # the order that broke quantized files
    assert our_tensors == real_tensors
    assert our_keys == real_keys
    compared = [k for k in real_keys if k != "general.name"]  # the converter names the model after its folder
    assert _values(ours, compared) == _values(files[outtype], compared)
    # same quantizer, same rounding: the tensor bytes are the converter's too
    ours_data = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(ours)).tensors}
    for t in gguf.GGUFReader(str(files[outtype])).tensors:
        assert np.array_equal(np.asarray(t.data), ours_data[t.name]), t.name


@pytest.mark.parametrize("preset", LLAMA_REAL_PRESETS + ("IQ4_XS",))
def test_presets_assign_what_llama_quantize_assigns(llama_real, preset, tmp_path):
    _, files = llama_real
    if preset not in files:
        assert not in_ci(), "CI builds llama-quantize"
        pytest.skip("no llama-quantize here (LLAMA_QUANTIZE, or bench/real_gguf.py --build-tools)")
    real_tensors, _ = _layout(files[preset])
    if preset in LLAMA_REAL_PRESETS:
        ours = make_tiny(tmp_path / "ours.gguf", preset=preset, seed=0, write_reference=False)[0]
        our_tensors, _ = _layout(ours)
        assert our_tensors == real_tensors
        assert _values(ours, ["general.file_type"]) == _values(files[preset], ["general.file_type"])
    else:  # no quantizer for IQ4_XS here: the type rules alone, on the converter's BF16 file
        source = {n: (ty, tuple(reversed(ne))) for n, ty, ne in _layout(files["BF16"])[0]}
        types = quantize_types(source, preset, n_layers_all=4, n_experts=8, n_gqa=4)
        assert types == {n: ty for n, ty, _ in real_tensors}


def test_the_shim_loads_the_converters_files(llama_real):
    """Each real file through vLLM's loader (CPU harness, shim active) against what the file stores."""
    from tests import test_gguf_vllm_load as load_test

    root, files = llama_real
    names = list(files)
    out = root / "loaded"
    results = load_in_cpu_harness(out, [files[n] for n in names])
    for i, (name, result) in enumerate(zip(names, results)):
        load_test.check_every_parameter(result, out / f"{i}.npz", files[name], main_type(name), f"real {name}")
    # CI has llama-quantize: the presets and the very low-bit ones made with an importance matrix are among them
    assert not in_ci() or {*LLAMA_REAL_PRESETS, *IMATRIX_PRESETS} <= set(names)



def test_iq_experts_on_vllms_kernels_refuse_a_batch_vllms_grid_cannot_launch(llama_real):
    """llama-quantize's IQ2_XXS file with GLM5_SHIM_GGUF_KERNELS=vllm: vLLM's vector MoE kernel launches tokens x
    top-k (2 here) blocks on a grid axis of at most 65 535, so a step of 32 768 batched tokens is refused in the front
    end, naming the file and the limit; 32 767 passes, and so does 32 768 on the shim's kernels.  (vLLM's CPU platform
    sets an MLA model's batched tokens to its max_model_len, so the cases set that.)"""
    import subprocess
    import sys

    from tests.helpers import REPO, child_env

    root, files = llama_real
    if "IQ2_XXS" not in files:
        assert not in_ci(), "CI builds llama-quantize: its IQ2_XXS file must be here"
        pytest.skip("llama-quantize and llama-imatrix are not built here")
    cases = [{"model": str(files["IQ2_XXS"]), "max_model_len": n, "max_num_batched_tokens": n} for n in (32768, 32767)]
    out = {}
    for kernels in ("vllm", "shim"):
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "vllm_cpu_harness.py"), "configs",
                               json.dumps(cases)], env=child_env({"GLM5_SHIM_GGUF_KERNELS": kernels,
                                                                 "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
                              capture_output=True, text=True, timeout=900, cwd=str(REPO))
        out[kernels] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert len(out[kernels]) == 2, proc.stderr[-3000:]
    refused, allowed = out["vllm"]
    assert not refused["ok"]
    assert refused["error"].startswith(f"GGUFError: glm5-shim: {files['IQ2_XXS']}: the MoE of blk.")
    assert "runs on vLLM's GGUF kernels (GLM5_SHIM_GGUF_KERNELS=vllm)" in refused["error"]
    assert "in IQ2_XXS on their vector kernel" in refused["error"]
    assert "--max-num-batched-tokens 32768 x 2 experts a token is 65536; pass --max-num-batched-tokens 32767" in \
        refused["error"] and "\n" not in refused["error"]
    assert allowed["ok"], allowed
    assert all(r["ok"] for r in out["shim"]), out["shim"]


# --- GLM-5.2 (shared indexers) and the split MTP files ------------------------------------------------------------
# The converter's three files of one checkpoint: the whole model, `--no-mtp` (the trunk) and `--mtp` (the draft head),
# each against make_tiny's split_mtp option that claims to write it.
GLM52 = dict(layers=7, indexer_types="glm52", context_length=1 << 20, seed=0)
MTP_MODES = {"whole": ((), None), "no-mtp": (("--no-mtp",), "trunk"), "mtp": (("--mtp",), "mtp")}
GLM52_OUTTYPES = ("BF16", "Q8_0")


@pytest.fixture(scope="module")
def real52(tmp_path_factory):
    """(root, HF checkpoint, {(mode, outtype): converter's GGUF}) for a GLM-5.2-style tiny model."""
    from concurrent.futures import ThreadPoolExecutor

    from glm5_shim.gguf.fixture import reference_dir

    real_gguf = bench_module("real_gguf")
    try:
        tree = real_gguf.llama_cpp_tree()
    except RuntimeError as exc:
        if in_ci():
            raise
        pytest.skip(f"llama.cpp's converter is not available here: {exc}")
    root = tmp_path_factory.mktemp("real52")
    make_tiny(root / "source.gguf", quant="Q8_0", **GLM52)  # only its HF checkpoint is used
    checkpoint = reference_dir(root / "source.gguf")
    jobs = {(mode, outtype): (root / f"real-{mode}-{outtype}.gguf", outtype.lower(), extra)
            for mode, (extra, _) in MTP_MODES.items() for outtype in GLM52_OUTTYPES}
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(real_gguf.convert, checkpoint, out, outtype, extra=extra, tree=tree)
                   for key, (out, outtype, extra) in jobs.items()}
        files = {key: future.result() for key, future in futures.items()}
    return root, checkpoint, files


def _fields(path) -> dict:
    """key → (value, GGUF value types) for every metadata key (the types tell a bool array from a uint32 one)."""
    reader = gguf.GGUFReader(str(path))
    return {k: (f.contents(), [t.name for t in f.types]) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("outtype", GLM52_OUTTYPES)
@pytest.mark.parametrize("mode", list(MTP_MODES))
def test_make_tiny_writes_the_converters_glm52_files(real52, mode, outtype, tmp_path):
    _, _, files = real52
    real = files[(mode, outtype)]
    ours = make_tiny(tmp_path / "ours.gguf", quant=outtype, split_mtp=MTP_MODES[mode][1], write_reference=False,
                     **GLM52)[0]
    assert _layout(ours) == _layout(real)  # tensors (names, order, types, shapes) and keys, in order
    ours_fields, real_fields = _fields(ours), _fields(real)
    ours_fields.pop("general.name"), real_fields.pop("general.name")  # the converter names it after the folder
    assert ours_fields == real_fields
    ours_data = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(ours)).tensors}
    for t in gguf.GGUFReader(str(real)).tensors:
        assert np.array_equal(np.asarray(t.data), ours_data[t.name]), t.name


@pytest.mark.parametrize("mode", list(MTP_MODES))
def test_what_the_converter_writes_for_glm52(real52, mode):
    """The facts make_tiny copies, stated: one bool per trunk layer (the HF list, which has no entry for the MTP
    layer), no indexer tensors in shared layers, and what --no-mtp / --mtp keep."""
    _, checkpoint, files = real52
    hf = json.loads((checkpoint / "config.json").read_text())
    n_layers = hf["num_hidden_layers"]
    assert len(hf["indexer_types"]) == n_layers == 7
    fields = _fields(files[(mode, "Q8_0")])
    names = [t[0] for t in _layout(files[(mode, "Q8_0")])[0]]
    types, kinds = fields["glm-dsa.attention.indexer.types"]
    assert types == [True, True, True, False, False, False, True] and kinds == ["ARRAY", "BOOL"]
    assert fields["glm-dsa.context_length"][0] == 1 << 20
    blocks = sorted({int(n.split(".")[1]) for n in names if n.startswith("blk.")})
    if mode == "no-mtp":
        assert fields["glm-dsa.block_count"][0] == n_layers and "glm-dsa.nextn_predict_layers" not in fields
        assert blocks == list(range(n_layers))
    else:  # block_count counts the MTP block; the indexer types still cover the trunk only (block_count - nextn)
        assert fields["glm-dsa.block_count"][0] == n_layers + 1 and fields["glm-dsa.nextn_predict_layers"][0] == 1
        assert blocks == (list(range(n_layers + 1)) if mode == "whole" else [n_layers])
    if mode == "mtp":
        assert [n for n in names if not n.startswith("blk.")] == ["output.weight", "token_embd.weight",
                                                                   "output_norm.weight"]
        assert "blk.0.attn_norm.weight" not in names and f"blk.{n_layers}.nextn.eh_proj.weight" in names
    for layer in blocks:
        indexer = [n for n in names if n.startswith(f"blk.{layer}.indexer.")]
        shared = layer < n_layers and not types[layer]
        assert len(indexer) == (0 if shared else 5), (layer, indexer)  # the MTP block keeps its indexer


def test_the_converters_glm52_files_validate(real52):
    from glm5_shim.gguf.validate import ERROR, validate
    from glm5_shim.preflight import problem

    _, _, files = real52
    for outtype in GLM52_OUTTYPES:
        for mode in ("whole", "no-mtp"):  # BF16 routed experts are re-quantized at load: one warning each
            findings = validate(files[(mode, outtype)])
            assert all(f.level != ERROR for f in findings), findings
            assert (all("routed experts are BF16" in f.message for f in findings)
                    and bool(findings) == (outtype == "BF16"))
        mtp_only = files[("mtp", outtype)]
        findings = validate(mtp_only)
        assert [f.level for f in findings] == [ERROR]
        assert findings[0].message == (f"{mtp_only}: this is an MTP-only GGUF (llama.cpp convert --mtp: only the "
                                       f"nextn block blk.7 and the embeddings); serve the main model file, MTP "
                                       f"drafts come from a file that holds its MTP layer with the trunk "
                                       f"(--speculative-config method mtp), not from a separate --mtp file")
        assert problem(str(mtp_only)) == findings[0].message  # launch.sh's one line, and the shim's in get_config


def test_the_shim_loads_the_converters_glm52_files(real52):
    """The converter's whole and --no-mtp files, and make_tiny's file that declares the MTP block without its
    tensors, through vLLM's loader (CPU harness, shim active) against what each file stores."""
    from glm5_shim.gguf.fixture import write_dequantized_reference
    from tests import test_gguf_vllm_load as load_test

    root, checkpoint, files = real52
    cases = {f"{mode} {outtype}": files[(mode, outtype)] for mode in ("whole", "no-mtp") for outtype in ("Q8_0",)}
    cases["no-mtp BF16"] = files[("no-mtp", "BF16")]
    for path in cases.values():
        write_dequantized_reference(path, like=checkpoint)
    cases["stripped Q8_0"] = make_tiny(root / "stripped.gguf", quant="Q8_0", split_mtp="stripped",
                                       reference="dequantized", **GLM52)[0]
    out = root / "loaded"
    results = load_in_cpu_harness(out, list(cases.values()))
    for i, ((name, path), result) in enumerate(zip(cases.items(), results)):
        load_test.check_every_parameter(result, out / f"{i}.npz", path, name.split()[-1], f"real GLM-5.2 {name}")
