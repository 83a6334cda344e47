"""mtp-prompt-logprobs: vLLM's own _get_prompt_logprobs_dict, run on the CPU on a bare GPUModelRunner, gives the
prompt log-probs of the hidden states the target produced even when the drafter wrote over them afterwards (as its
CUDA graphs do in the shared graph pool); stock vLLM gives those of the overwritten memory."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.helpers import shim_in_this_process

VOCAB, HIDDEN, PROMPT = 11, 6, [3, 1, 4, 1, 5, 9]


def _runner(cls, lm_head):
    """A GPUModelRunner with only what _get_prompt_logprobs_dict reads: one request, its whole prompt scheduled."""
    from vllm.v1.sample.sampler import Sampler

    runner = object.__new__(cls)
    runner.num_prompt_logprobs = {"r": 1}
    runner.requests = {"r": SimpleNamespace(prompt_token_ids=list(PROMPT), in_progress_prompt_logprobs_cpu=None,
                                            num_computed_tokens=0)}
    runner.device = torch.device("cpu")
    runner.input_batch = SimpleNamespace(req_id_to_index={"r": 0})
    runner.query_start_loc = SimpleNamespace(np=np.array([0, len(PROMPT)]))
    runner.model = SimpleNamespace(compute_logits=lambda h: h.float() @ lm_head.T)
    runner.sampler = Sampler()
    runner._sync_device = lambda: None
    runner.model_config = SimpleNamespace(model="/models/GLM-5-Q4_K_M.gguf")
    runner.__dict__["_glm5_shim_is_glm_gguf"] = True   # what is_glm_dsa_gguf says of a GLM-5 file
    return runner


def _drafted_then_prompt_logprobs(runner, hidden, patched: bool):
    """The order of GPUModelRunner.sample_tokens: the drafter runs (its graphs write over the pool), then the
    bookkeeping computes the prompt log-probs from the hidden states sliced to the scheduled tokens."""
    from glm5_shim.patches.mtp_prompt_logprobs import keeping_prompt_hidden_states

    def drafter_in_the_pool(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, *rest):
        hidden_states.fill_(float("nan"))   # another graph's buffers in the same pool memory

    # the replacement's wrapper around a stand-in for the stock drafter (the real one needs a GPU and a model)
    propose = keeping_prompt_hidden_states(drafter_in_the_pool) if patched else drafter_in_the_pool
    scheduled = SimpleNamespace(total_num_scheduled_tokens=len(PROMPT))   # the rest of hidden: graph padding
    propose(runner, scheduled, torch.zeros(1, 1, dtype=torch.int32), None, hidden, None, None, None, None, None)
    out = runner._get_prompt_logprobs_dict(hidden[: len(PROMPT)], {"r": len(PROMPT)})
    return out["r"].logprobs[:, 0]   # the log-prob of each next prompt token


@pytest.fixture
def lm_head():
    return torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))


def idle_drafter(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, *rest):  # writes nothing
    pass


def test_prompt_logprobs_come_from_the_hidden_states_before_the_drafter(lm_head):
    hidden = torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(1))   # 6 prompt rows + 2 graph padding
    logits = hidden[: len(PROMPT) - 1] @ lm_head.T
    want = torch.log_softmax(logits.double(), -1)[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]
    with shim_in_this_process("vllm.v1.worker.gpu_model_runner") as registry:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        from glm5_shim.patches.mtp_prompt_logprobs import _KEPT, keeping_prompt_hidden_states

        assert registry.get("mtp-prompt-logprobs").state == "applied", registry.get("mtp-prompt-logprobs").as_dict()
        assert "keeping_prompt_hidden_states" in GPUModelRunner.propose_draft_token_ids.__qualname__

        got = _drafted_then_prompt_logprobs(_runner(GPUModelRunner, lm_head), hidden.clone(), patched=True)
        assert torch.allclose(got.double(), want, atol=1e-5), (got, want)
        # the installed method around vLLM's own drafter call: it keeps the scheduled rows, then runs the stock method
        # (which, on this bare runner, stops at the first attribute a real drafter needs)
        runner = _runner(GPUModelRunner, lm_head)
        with pytest.raises(AttributeError):
            GPUModelRunner.propose_draft_token_ids(runner, SimpleNamespace(total_num_scheduled_tokens=len(PROMPT)),
                                                   torch.zeros(1, 1, dtype=torch.int32), None, hidden, None, None,
                                                   None, None, None)
        pool, copy = runner.__dict__[_KEPT]
        assert pool is hidden and torch.equal(copy, hidden[: len(PROMPT)]) and copy.data_ptr() != hidden.data_ptr()
        # no request asking for prompt log-probs: nothing is kept, the hidden states are read as they are
        runner = _runner(GPUModelRunner, lm_head)
        runner.num_prompt_logprobs = {}
        gpu_ids = torch.zeros(1, 1, dtype=torch.int32)
        keeping_prompt_hidden_states(idle_drafter)(runner, None, gpu_ids, None, hidden, None, None, None, None, None)
        assert _KEPT not in runner.__dict__
        # a drafter that runs after the bookkeeping (n-gram: sampled ids as lists) keeps nothing either: the prompt
        # log-probs of this step are computed already, and a copy left behind would be read at the next step
        runner = _runner(GPUModelRunner, lm_head)
        keeping_prompt_hidden_states(idle_drafter)(runner, None, [[1]], None, hidden, None, None, None, None, None)
        assert _KEPT not in runner.__dict__

    # stock vLLM (every patch undone): the prompt log-probs of the memory the drafter wrote
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert "keeping_prompt_hidden_states" not in GPUModelRunner.propose_draft_token_ids.__qualname__
    stock = _drafted_then_prompt_logprobs(_runner(GPUModelRunner, lm_head), hidden.clone(), patched=False)
    assert torch.isnan(stock).all()


def test_kept_copy_is_used_only_for_views_of_the_same_hidden_states():
    from glm5_shim.patches.mtp_prompt_logprobs import _KEPT, kept_hidden_states

    pool = torch.zeros(8, HIDDEN)
    copy = torch.ones(8, HIDDEN)
    runner = SimpleNamespace()
    runner.__dict__[_KEPT] = (pool, copy)
    assert torch.equal(kept_hidden_states(runner, pool[:5]), copy[:5])
    assert _KEPT not in runner.__dict__   # used once
    other = torch.zeros(8, HIDDEN)
    runner.__dict__[_KEPT] = (pool, copy)
    assert kept_hidden_states(runner, other) is other   # not the tensor the drafter was given
    runner.__dict__[_KEPT] = (pool, copy)
    later = pool[2:5]
    assert kept_hidden_states(runner, later) is later   # a view from another row: left alone
