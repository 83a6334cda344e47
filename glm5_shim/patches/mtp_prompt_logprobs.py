"""Prompt log-probabilities stay right with an MTP draft under CUDA graphs.

Target: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner``.  In vLLM 0.23 ``sample_tokens`` runs the MTP/EAGLE
drafter (``propose_draft_token_ids``) before ``_bookkeeping_sync``, which computes the prompt log-probabilities
(``_get_prompt_logprobs_dict``) from the target's ``hidden_states``.  Under piecewise CUDA graphs those hidden
states are a weak reference into the graph memory pool (the last graph's output), and the drafter's own graphs
replay in the same pool: by the time the prompt log-probabilities are computed they may have been written over.
Seen on the H200 (bench/journal/2026-12-04.md): a 40-layer GLM-5 slice served with MTP K=1 returned prompt
log-probs off by up to 11 nats against the same server without a draft (its generated tokens and their log-probs
were right), and with K=2 or 3 NaN, which the OpenAI server cannot serialise (HTTP 400); without CUDA graphs, or
with another memory layout, they were right.  Every ``prompt_logprobs`` / ``echo`` user (lm-eval's
log-likelihood tasks) gets wrong numbers silently.

The replacement: when a request of the batch asks for prompt log-probs, ``propose_draft_token_ids`` first keeps a
copy of the hidden states (an ordinary allocation, outside the graph pool), and ``_get_prompt_logprobs_dict`` reads
that copy instead of the pool's.  Nothing is copied when no request asks (the common case).  Only for a glm-dsa
GGUF served with a draft.
"""
from __future__ import annotations

import inspect

from glm5_shim.registry import Patch, require, require_attr, require_source

_TARGET = "vllm.v1.worker.gpu_model_runner"
_KEPT = "_glm5_shim_prompt_hidden"   # (the pool's tensor, its copy), between the drafter and the bookkeeping


def _check(module) -> None:
    runner = require_attr(module, "GPUModelRunner", _TARGET)
    propose = require_attr(runner, "propose_draft_token_ids", "GPUModelRunner")
    require({"sampled_token_ids", "hidden_states"} <= set(inspect.signature(propose).parameters),
            "GPUModelRunner.propose_draft_token_ids no longer takes sampled_token_ids and hidden_states")
    prompt = require_attr(runner, "_get_prompt_logprobs_dict", "GPUModelRunner")
    require(list(inspect.signature(prompt).parameters)[:2] == ["self", "hidden_states"],
            "GPUModelRunner._get_prompt_logprobs_dict no longer takes hidden_states first")
    source = require_source(require_attr(runner, "sample_tokens", "GPUModelRunner"), "GPUModelRunner.sample_tokens",
                            "propose_draft_token_ids(sampled_token_ids)", "._bookkeeping_sync(")
    draft, bookkeeping = source.find("propose_draft_token_ids(sampled_token_ids)"), source.find("._bookkeeping_sync(")
    require(0 <= draft < bookkeeping,
            "GPUModelRunner.sample_tokens no longer runs the GPU-token drafter before _bookkeeping_sync")
    require_source(runner._bookkeeping_sync, "GPUModelRunner._bookkeeping_sync", "self._get_prompt_logprobs_dict(",
                   why="it computes the prompt log-probs")


def _serves_glm_gguf(runner) -> bool:
    cached = runner.__dict__.get("_glm5_shim_is_glm_gguf")
    if cached is None:
        from glm5_shim.loading.served import serves_glm_gguf

        cached = runner.__dict__["_glm5_shim_is_glm_gguf"] = serves_glm_gguf(runner.vllm_config, "target")
    return cached


def keeping_prompt_hidden_states(stock_propose):
    """propose_draft_token_ids that first copies the target's hidden states when a request wants prompt log-probs."""
    signature = inspect.signature(stock_propose)

    def propose_draft_token_ids(self, *args, **kwargs):
        if self.num_prompt_logprobs and _serves_glm_gguf(self):
            import torch

            arguments = signature.bind(self, *args, **kwargs).arguments
            # sampled ids on the GPU: a drafter that runs before the bookkeeping (MTP/EAGLE); as lists, one that runs
            # after it (n-gram on the CPU), when the prompt log-probs are already computed: nothing to keep then
            hidden = arguments["hidden_states"]
            if isinstance(arguments["sampled_token_ids"], torch.Tensor) and isinstance(hidden, torch.Tensor):
                # the scheduled rows only (the bookkeeping reads no more): not the graph's padding
                rows = getattr(arguments["scheduler_output"], "total_num_scheduled_tokens", None) or hidden.shape[0]
                self.__dict__[_KEPT] = (hidden, hidden[:rows].clone())
        return stock_propose(self, *args, **kwargs)

    return propose_draft_token_ids


def kept_hidden_states(runner, hidden_states):
    """The copy propose_draft_token_ids kept of these hidden states (a view from row 0 of them), else them."""
    kept = runner.__dict__.pop(_KEPT, None)
    if kept is None:
        return hidden_states
    pool, copy = kept
    same = (hidden_states.data_ptr() == pool.data_ptr() and hidden_states.shape[1:] == pool.shape[1:]
            and hidden_states.stride() == pool.stride() and hidden_states.shape[0] <= copy.shape[0])
    return copy[: hidden_states.shape[0]] if same else hidden_states


def _apply(module, patch: Patch) -> None:
    cls = module.GPUModelRunner
    patch.replace(cls, "propose_draft_token_ids", keeping_prompt_hidden_states(cls.propose_draft_token_ids))
    stock_prompt = cls._get_prompt_logprobs_dict

    def _get_prompt_logprobs_dict(self, hidden_states, *args, **kwargs):
        return stock_prompt(self, kept_hidden_states(self, hidden_states), *args, **kwargs)

    patch.replace(cls, "_get_prompt_logprobs_dict", _get_prompt_logprobs_dict)


PATCHES = [
    Patch(
        name="mtp-prompt-logprobs",
        target=_TARGET,
        replaces=(f"{_TARGET}:GPUModelRunner.propose_draft_token_ids",
                  f"{_TARGET}:GPUModelRunner._get_prompt_logprobs_dict"),
        summary="prompt log-probs with an MTP draft under CUDA graphs: computed from a copy of the target's hidden "
                "states taken before the drafter's graphs replay over them (vLLM 0.23 reads the graph pool after)",
        check=_check,
        apply=_apply,
    ),
]
