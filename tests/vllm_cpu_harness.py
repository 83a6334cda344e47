"""Child-process harness: build vLLM's config, tokenizer and GLM-5 model from a GGUF on a CPU-only machine.

Run as a script (the shim activated through PYTHONPATH, as launch.sh does):
    python tests/vllm_cpu_harness.py OUT_DIR MODEL.gguf [MODEL.gguf ...]
    python tests/vllm_cpu_harness.py configs '[{"model": ...EngineArgs kwargs...}, ...]'  (config + tokenizer)
    python tests/vllm_cpu_harness.py mtp OUT_DIR MODEL.gguf [...]  (the target, then vLLM's MTP draft of it)
    python tests/vllm_cpu_harness.py mtp-tp TP RANK INIT_FILE OUT_DIR MODEL.gguf  (rank RANK of the same at TP)
For each model it writes OUT_DIR/<i>.npz (every parameter as loaded: float arrays, or raw uint8 GGUF blocks
with their GGML type) and prints one JSON line of results; in mtp mode the draft's parameters go to
OUT_DIR/<i>-draft.npz, and the JSON line also says what vLLM's proposer then shares with the target.

Test scaffolding only, and it says so: vLLM has no MLA on CPU, so the attention backend is pinned to the shim's
(constructed here, never run) and MLA's unused dense-prefill backend (FlashAttention, a CUDA library) is stubbed.
Nothing is executed on the model; this checks construction, the weight stream and post-load processing.
"""
from __future__ import annotations

import json
import sys
import tempfile
import traceback

import numpy as np


def _install_cpu_scaffolding() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    cpu_backend = CpuPlatform.get_attn_backend_cls.__func__

    def backend(cls, selected_backend, attn_selector_config, *args, **kwargs):
        # GLM-5's MLA on the shim's backend (constructed, never run); other models (issue #51) keep vLLM's CPU one
        if attn_selector_config.use_mla:
            return "glm5_shim.attention.backend.Glm5SparseMLABackend"
        return cpu_backend(cls, selected_backend, attn_selector_config, *args, **kwargs)

    CpuPlatform.get_attn_backend_cls = classmethod(backend)
    platforms._current_platform = CpuPlatform()
    import vllm.model_executor.layers.attention.mla_attention as mla

    class _UnusedPrefill:  # sparse MLA never calls the dense prefill backend
        def __init__(self, **kwargs):
            pass

    mla.get_mla_prefill_backend = lambda vllm_config: _UnusedPrefill


def _dump(model, path: str, uninitialised: list | None = None) -> dict:
    """Every parameter into `path`; parameters still uninitialised are listed in `uninitialised` when given (the
    MTP draft's shared head, which vLLM's proposer replaces with the target's lm_head), an error otherwise."""
    import torch

    arrays, types = {}, {}
    for name, param in model.named_parameters():
        if name.endswith("qweight_type"):
            continue
        if uninitialised is not None and isinstance(param, torch.nn.parameter.UninitializedParameter):
            uninitialised.append(name)
            continue
        t = param.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        arrays[name] = t.cpu().numpy()
        if name.endswith("qweight"):
            owner = dict(model.named_parameters())[name[: -len("qweight")] + "qweight_type"]
            types[name] = getattr(owner, "weight_type", None)
            shard_types = getattr(owner, "shard_weight_type", None)
            if shard_types:
                # a fused linear: what GGUFLinearMethod.apply reads, in the order it reads it
                # shard ids: 0, 1 (gate/up, q_a/kv_a) or "q", "k", "v" (another model's attention, issue #51)
                types[name] = {"shards": [[i if isinstance(i, str) else int(i), *map(int, param.shard_offset_map[i]),
                                           int(shard_types[i])] for i in param.shard_id]}
    np.savez(path, **arrays)
    return types


def configs(cases: list[dict]) -> None:
    """For each case (EngineArgs keyword arguments), print the config facts vLLM ends up with, or the error."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.tokenizers import get_tokenizer

    for case in cases:
        try:
            cfg = EngineArgs(**case).create_engine_config()
            mc = cfg.model_config
            tok = get_tokenizer(mc.tokenizer)
            texts = ["Hello world, GLM-5 says 12345!", "  spaces\n\ttabs  ", "héllo wörld ✓ 漢字",
                     "def f(x):\n    return x**2", "<|user|>hi<|assistant|>"]
            gen = mc.try_get_generation_config()
            print(json.dumps({"ok": True, "model_type": mc.hf_config.model_type, "dtype": str(mc.dtype),
                              "max_model_len": mc.max_model_len, "index_topk": mc.hf_config.index_topk,
                              "quantization": mc.quantization, "tokenizer": str(mc.tokenizer),
                              "ids": [tok.encode(t, add_special_tokens=False) for t in texts],
                              "chat": tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)
                              if getattr(tok, "chat_template", None) else None,
                              "eos": gen.get("eos_token_id") if isinstance(gen, dict) else None}), flush=True)
        except Exception as exc:
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}", "frames": frames}), flush=True)


def _apply_test_switches() -> None:
    """HARNESS_FILE_ORDER=1: the shim's loader yields tensors in file order (without LoadPlan.stream_order's
    regrouping); HARNESS_STOCK_SHARD_ORDER=1: the gguf-shard-order patch is undone (vLLM's own arrival order);
    HARNESS_STOCK_INDEXER=1: the shared-indexer patch is undone (vLLM builds an Indexer in every layer).
    Together they show what vLLM does with a llama.cpp file without either fix."""
    import os

    if os.environ.get("HARNESS_FILE_ORDER") == "1":
        from glm5_shim.gguf.load_plan import LoadPlan

        LoadPlan.stream_order = lambda self: list(self.tensors)
    if os.environ.get("HARNESS_STOCK_SHARD_ORDER") == "1":
        import vllm.model_executor.layers.quantization.gguf  # noqa: F401  (triggers the patch)
        _undo("gguf-shard-order")
    if os.environ.get("HARNESS_STOCK_INDEXER") == "1":
        import vllm.model_executor.models.deepseek_v2  # noqa: F401
        _undo("shared-indexer")


def _undo(name: str) -> None:
    from glm5_shim.registry import APPLIED, REGISTRY

    patch = REGISTRY.get(name)
    assert patch.state == APPLIED, patch.as_dict()
    patch.undo()


def _shim_kernels_take_this_process() -> bool | None:
    """Whether the shim's GGUF kernels would take this process's matmuls (it loaded a glm-dsa GGUF); None when the
    shim is not active here (GLM5_SHIM=0)."""
    import sys

    if "glm5_shim.matmul.gguf_ops" not in sys.modules:
        return None
    return sys.modules["glm5_shim.matmul.gguf_ops"].glm_gguf_loaded()


def _indexer_layout(model, cfg) -> dict:
    """Per decoder layer: does vLLM skip its top-k, what indexer module it has and how many parameters that holds;
    and which indexer K caches were registered (each one gets KV-cache memory)."""
    layers = []
    for module in model.modules():
        if type(module).__name__ == "DeepseekV2MLAAttention":
            indexer = module.indexer
            layers.append({"prefix": getattr(module.mla_attn, "prefix", ""),
                           "skip_topk": bool(module.mla_attn.skip_topk),
                           "indexer": type(indexer).__name__,
                           "indexer_params": sum(p.numel() for p in indexer.parameters()),
                           "shares_buffer": indexer.topk_indices_buffer is model.model.layers[0].self_attn.indexer
                           .topk_indices_buffer})
    caches = sorted(k for k in cfg.compilation_config.static_forward_context if k.endswith("indexer.k_cache"))
    return {"layers": layers, "indexer_k_caches": caches,
            "index_topk_pattern": getattr(cfg.model_config.hf_config, "index_topk_pattern", None)}


def _load_target_and_draft(model_path: str, out_dir: str, i: int, init, tp: int = 1) -> dict:
    """What vLLM's MTP proposer does at start-up, on the CPU: build the engine config with --speculative-config
    method "mtp", load the target, load the draft as SpecDecodeBaseProposer._get_model does (its draft VllmConfig,
    the draft's model and load config), then give it the target's embedding and lm_head with the proposer's own
    _maybe_share_embeddings / _maybe_share_lm_head."""
    import types

    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model, get_model_loader
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    result = {"model": model_path}
    cfg = EngineArgs(model=model_path, enforce_eager=True, max_model_len=512, dtype="float32", tensor_parallel_size=tp,
                     speculative_config={"method": "mtp", "num_speculative_tokens": 1}).create_engine_config()
    spec = cfg.speculative_config
    draft_config = spec.draft_model_config
    result["draft_config"] = {"model_type": draft_config.hf_config.model_type,
                              "architectures": draft_config.hf_config.architectures,
                              "n_predict": getattr(draft_config.hf_config, "n_predict", None),
                              "num_nextn_predict_layers": draft_config.hf_config.num_nextn_predict_layers,
                              "num_hidden_layers": draft_config.hf_config.num_hidden_layers,
                              "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
                              "quantization": draft_config.quantization, "model": draft_config.model}
    with set_current_vllm_config(cfg):
        init()
        target = get_model_loader(cfg.load_config).load_model(vllm_config=cfg, model_config=cfg.model_config)
    proposer = types.SimpleNamespace(speculative_config=spec, vllm_config=cfg, use_local_argmax_reduction=False)
    draft_cfg = SpecDecodeBaseProposer._create_draft_vllm_config(proposer)
    result["quant_config_shared"] = draft_cfg.quant_config is cfg.quant_config
    with set_current_vllm_config(draft_cfg):
        draft = get_model(vllm_config=draft_cfg, model_config=draft_config, load_config=spec.draft_load_config)
    result["draft_class"] = type(draft).__name__
    result["uninitialised"] = []
    result["types"] = _dump(draft, f"{out_dir}/{i}-draft.npz", result["uninitialised"])
    proposer.model = draft
    SpecDecodeBaseProposer._maybe_share_embeddings(proposer, target)
    SpecDecodeBaseProposer._maybe_share_lm_head(proposer, target)
    head = next(iter(draft.model.layers.values())).shared_head.head
    result["shares"] = {"embed_tokens": draft.model.embed_tokens is target.model.embed_tokens,
                        "shared_head.head": head is target.lm_head}
    import os

    probe = os.environ.get("HARNESS_MTP_PROBE")
    if probe:
        _probe_mtp_layer(draft, probe, f"{out_dir}/{i}-probe.npz")
    return result


def _probe_mtp_layer(draft, inputs: str, out: str) -> None:
    """vLLM's own MTP layer on the CPU, around its decoder block: DeepSeekMultiTokenPredictorLayer.forward (position-0
    masking, enorm / hnorm, eh_proj) and DeepSeekMTP.compute_logits (shared_head.norm, then the target's lm_head).
    The block itself (MLA attention, the GGUF MoE) has no CPU path in vLLM 0.23, so it is replaced by the identity
    here: inputs (npz: next_ids, hidden, positions) -> out (npz: eh_proj_out = the block's input, logits)."""
    import numpy as np
    import torch

    data = np.load(inputs)
    layer = next(iter(draft.model.layers.values()))
    seen = {}

    def identity_block(positions, hidden_states, residual):
        seen["x"] = hidden_states.detach().clone()
        return torch.zeros_like(hidden_states), hidden_states

    layer.mtp_block.forward = identity_block
    ids = torch.from_numpy(data["next_ids"])
    positions = torch.from_numpy(data["positions"])
    with torch.no_grad():
        hidden = layer(ids, positions, torch.from_numpy(data["hidden"]), draft.model.embed_tokens(ids))
        logits = draft.compute_logits(hidden)
    del layer.mtp_block.forward  # the block's own forward again
    np.savez(out, eh_proj_out=seen["x"].float().numpy(), logits=logits.float().numpy(),
             **_fp16_block_scaling(layer.mtp_block, seen["x"]))


def _fp16_block_scaling(block, x) -> dict:
    """vLLM's DeepseekV2DecoderLayer.forward (the MTP block's own code) in float32 and float16, its attention and MoE
    replaced by fixed functions that follow vLLM's float16 conventions (the layer divides the attention output by
    routed_scaling_factor itself; the MoE returns its output divided by it, as the fused-MoE runner does for a MoE
    with a shared expert): the block's output (residual + hidden, as DeepSeekMultiTokenPredictorLayer takes it) with
    the layer index it was built with (the shim's patch: 0) and with num_hidden_layers (vLLM's own)."""
    import torch

    rsf = block.routed_scaling_factor

    class Attention(torch.nn.Module):
        def forward(self, positions, hidden_states, llama_4_scaling=None):
            return torch.tanh(hidden_states.float() @ weight).to(hidden_states.dtype)

    class MoE(torch.nn.Module):
        def forward(self, hidden_states):
            out = torch.sin(hidden_states.float() @ weight.T)
            return (out / rsf if hidden_states.dtype == torch.float16 else out).to(hidden_states.dtype)

    weight = torch.randn(x.shape[-1], x.shape[-1], generator=torch.Generator().manual_seed(0)) / x.shape[-1] ** 0.5
    built_with = block.layer_idx
    block.self_attn, block.mlp = Attention(), MoE()
    out = {"built_layer_idx": np.array(built_with)}
    positions = torch.arange(x.shape[0])
    for name, dtype, layer_idx in (("fp32", torch.float32, built_with), ("fp16_built", torch.float16, built_with),
                                   ("fp16_idx_n", torch.float16, 99)):
        block.layer_idx = layer_idx
        block.to(dtype)
        with torch.no_grad():
            hidden, residual = block(positions, x.to(dtype), None)
        out["block_" + name] = (residual + hidden).float().numpy()
    block.layer_idx = built_with
    return out


def mtp(out_dir: str, models: list[str], tp: int = 1, rank: int = 0, init_file: str | None = None) -> None:
    """Each model's target and MTP draft as rank `rank` of a TP group of `tp` (gloo over init_file, shared by the
    group's processes) loads them; the draft's parameters in OUT_DIR/<i x tp + rank>-draft.npz, one JSON line each."""
    import tempfile as _tempfile

    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    state = {"initialized": False}

    def init():
        if not state["initialized"]:
            init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                         distributed_init_method=f"file://{init_file or _tempfile.mktemp()}")
            initialize_model_parallel(tp, 1)
            state["initialized"] = True

    for i, model_path in enumerate(models):
        try:
            result = _load_target_and_draft(model_path, out_dir, i * tp + rank, init, tp=tp)
            result["ok"] = True
        except Exception as exc:
            result = {"model": model_path, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "frames": [f.name for f in traceback.extract_tb(exc.__traceback__)]}
        print(json.dumps(result), flush=True)


def main(argv: list[str]) -> int:
    if argv[0] == "configs":
        _install_cpu_scaffolding()
        configs(json.loads(argv[1]))
        return 0
    if argv[0] == "mtp":
        _install_cpu_scaffolding()
        mtp(argv[1], argv[2:])
        return 0
    if argv[0] == "mtp-tp":
        _install_cpu_scaffolding()
        mtp(argv[4], [argv[5]], tp=int(argv[1]), rank=int(argv[2]), init_file=argv[3])
        return 0
    out_dir, models = argv[0], argv[1:]
    _install_cpu_scaffolding()
    _apply_test_switches()
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.tokenizers import get_tokenizer

    initialized = False
    for i, model_path in enumerate(models):
        result = {"model": model_path}
        try:
            cfg = EngineArgs(model=model_path, enforce_eager=True, max_model_len=512,
                             dtype="float32").create_engine_config()
            result["model_type"] = cfg.model_config.hf_config.model_type
            tok = get_tokenizer(cfg.model_config.tokenizer)
            result["tokenizer"] = {"vocab": len(tok), "eos": tok.eos_token_id}
            with set_current_vllm_config(cfg):
                if not initialized:
                    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                 distributed_init_method=f"file://{tempfile.mktemp()}")
                    initialize_model_parallel(1, 1)
                    initialized = True
                model = get_model_loader(cfg.load_config).load_model(vllm_config=cfg, model_config=cfg.model_config)
            result["types"] = _dump(model, f"{out_dir}/{i}.npz")
            result["indexer_layout"] = _indexer_layout(model, cfg)
            result["shim_kernels"] = _shim_kernels_take_this_process()
            result["ok"] = True
        except Exception as exc:
            result["ok"] = False
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["frames"] = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
