"""Checks of a vLLM config that serves a glm-dsa GGUF, run before any worker starts (the tp-split-check patch runs
them where vLLM builds its VllmConfig): a tensor-parallel size the file cannot be split at (vLLM 0.23 cuts packed
rows into TP byte ranges and would otherwise compute with pieces of blocks, silently; glm5_shim.gguf.tp_split), and
a batch size vLLM's own MoE kernel cannot launch for experts left on it (routing.vllm_moe_max_tokens: with IQ
experts and vLLM's default 8 192 batched tokens the engine would die in start-up's profile run with "CUDA error:
invalid argument").  Each raises GGUFError with one line.
"""
from __future__ import annotations


def check_tp_split(vllm_config) -> None:
    """Raise GGUFError (one line) when this config's GGUF cannot be split at its tensor-parallel size: the target
    model's weights, then those of its MTP draft (--speculative-config method mtp) at the draft's size."""
    from glm5_shim.loading.served import served_glm_ggufs

    for served in served_glm_ggufs(vllm_config):
        model_config, parallel, draft = served.model_config, served.parallel_config, served.role == "draft"
        _check_one(model_config, parallel, draft=draft)


def check_vllm_moe_grid(vllm_config) -> None:
    """Raise GGUFError (one line) when a step of --max-num-batched-tokens would route more tokens through vLLM's own
    GGUF MoE kernel than its launch grid takes, for the target's experts or its MTP draft's."""
    import torch

    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.loading.gguf_loading import load_plan_for

    tokens = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_batched_tokens", None)
    if not tokens:
        return
    from glm5_shim.loading.served import served_glm_ggufs

    for served in served_glm_ggufs(vllm_config):
        model_config, parallel, draft = served.model_config, served.parallel_config, served.role == "draft"
        problem = vllm_moe_grid_problem(
            load_plan_for(model_config.model, draft=draft), tokens, int(model_config.hf_config.num_experts_per_tok),
            acts_16bit=model_config.dtype in (torch.float16, torch.bfloat16), tp=parallel.tensor_parallel_size,
            expert_parallel=bool(parallel.enable_expert_parallel))
        if problem:
            raise GGUFError(f"glm5-shim: {problem}")


def vllm_moe_grid_problem(plan, tokens: int, top_k: int, *, acts_16bit: bool = True, tp: int = 1,
                          expert_parallel: bool = False) -> str | None:
    """The line that says why ``tokens`` a step is too many for vLLM's MoE kernel on this plan's experts, if so.  A
    MoE layer runs on vLLM's kernels when the shim's are switched off, the activations are not 16-bit (the shim's
    MoE takes bf16/fp16 only; vLLM's GGUF also runs float32), or one of its weights is a type or width (per rank:
    down's K is the intermediate size over the TP size) the shim's kernels do not cover (matmul/gguf_ops)."""
    import gguf

    from glm5_shim import settings
    from glm5_shim.kernels.gguf.routing import (VLLM_MOE_TILE_TYPES, VLLM_MOE_VECTOR_MAX_ROUTED, shim_kernel_covers,
                                                vllm_moe_max_tokens)
    from glm5_shim.gguf.tensor_map import ROLE_EXPERTS, TP_ROW

    switched_off = settings.gguf_kernels_choice() != "shim"
    layers: dict[int, list] = {}   # the routed experts' tensors (gate, up, down) by block, as the tensor table says
    for t in plan.tensors:
        if t.vllm_type is not None and t.spec is not None and t.spec.base_role == ROLE_EXPERTS:
            layers.setdefault(t.spec.layer, []).append(t)
    split = 1 if expert_parallel else tp   # a rank's share of a row-parallel weight's rows (down's K)
    for experts in layers.values():
        types = [int(gguf.GGMLQuantizationType[t.vllm_type]) for t in experts]
        limit = vllm_moe_max_tokens(top_k, *types)
        if limit is None or tokens <= limit:
            continue
        uncovered = [t for t, q in zip(experts, types)
                     if not shim_kernel_covers(q, t.info.shape[-1] // (split if t.spec.tp_split == TP_ROW else 1))]
        if switched_off:
            why = "GLM5_SHIM_GGUF_KERNELS=vllm"
        elif not acts_16bit:
            why = "float32 activations: the shim's kernels take bf16 or fp16"
        elif uncovered:
            why = f"the shim's kernels do not cover {uncovered[0].gguf_name} ({uncovered[0].vllm_type})"
        else:
            continue
        cause = next(t for t, q in zip(experts, types) if q not in VLLM_MOE_TILE_TYPES)
        hint = (", or leave GLM5_SHIM_GGUF_KERNELS unset for the shim's kernels" if switched_off and not uncovered
                else ", or serve in bfloat16" if why.startswith("float32") and not uncovered else "")
        return (f"{plan.model.path}: the MoE of {cause.gguf_name.rsplit('.ffn_', 1)[0]} runs on vLLM's GGUF kernels "
                f"({why}), and with {cause.gguf_name} in {cause.vllm_type} on their vector kernel, whose launch grid "
                f"takes at most {VLLM_MOE_VECTOR_MAX_ROUTED} routed tokens a step, but --max-num-batched-tokens "
                f"{tokens} x {top_k} experts a token is {tokens * top_k}; pass --max-num-batched-tokens {limit} or "
                f"less{hint}")
    return None


def _check_one(model_config, parallel, *, draft: bool) -> None:
    tp, ep = parallel.tensor_parallel_size, bool(parallel.enable_expert_parallel)
    if tp <= 1:
        return  # nothing is split
    from glm5_shim.loading.gguf_loading import load_plan_for
    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.gguf.tp_split import clean_tp_sizes, split_problems

    plan = load_plan_for(model_config.model, draft=draft)
    problems = split_problems(plan, tp, expert_parallel=ep)
    if not problems:
        return
    sizes = [s for s in (1, 2, 4, 8, 16) if s <= max(tp, 8)]
    clean = clean_tp_sizes(plan, sizes, expert_parallel=ep)
    hint = f"; this file splits cleanly at --tensor-parallel-size {', '.join(map(str, clean))}"
    if not ep and all(p.is_expert for p in problems) and not split_problems(plan, tp, expert_parallel=True):
        hint += f", or at {tp} with --enable-expert-parallel"
    if draft:
        hint += " (the MTP draft's layer; without --speculative-config the model does not load it)"
    raise GGUFError(f"glm5-shim: {problems[0].line(str(plan.model.path))}{hint}")
