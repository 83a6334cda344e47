"""bench/e2e.py's parts (the script is the entry point; see its docstring for what a run does).

  arms          Arm (model × attention path × KV-cache dtype), all_arms, the tiny models' shape, run limits
  prompts       words from the tokenizer's corpus, the prompts below and above index_topk, the chat
  servers       one `vllm serve` per arm through launch.sh: start, wait_ready, stop, alive; http_json;
                backends_from_log
  functional    greedy completions, streaming and chat checks, repeatability, bad requests; same_answer
  throughput    streaming throughput and the concurrent load
  reference     float32 transformers scoring of every arm's tokens
  summary       agreement, reference summaries, throughput ratios
  report        the markdown report
  run           `all`: the whole run
  command_line  the argument parser and the `all` / `report` / `reference` commands
  vllm_log      vLLM 0.23's start-up log lines and the numbers in them (also bench/long_context.py, slice_serve.py)
"""
