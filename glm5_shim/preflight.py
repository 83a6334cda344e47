"""Check a model argument before `vllm serve` starts: the one-line error the shim would raise inside vLLM, at once.

    python -m glm5_shim.preflight MODEL [--speculative-config JSON]

exit 0, silent: nothing to say: a glm-dsa GGUF the shim can load, or anything else (another architecture, a Hugging
  Face repo id, a directory...), which is vLLM's business;
exit 2: one line on stderr, the GGUFError the shim raises from vLLM's get_config for this model (it names the file
  and the tensor or metadata key), or, with --speculative-config asking for an MTP draft of a glm-dsa GGUF, the one
  the shim raises from vLLM's SpeculativeConfig when that file cannot serve one (glm5_shim.loading.mtp).

The same route as the shim's config hook (glm5_shim.patches.gguf_config): backend.hf_config decides whether the model
is a glm-dsa GGUF and validates it (glm5_shim.gguf.validate, headers, names and shapes only, no tensor data).  Neither
vLLM nor torch is imported.  launch.sh runs this before `exec vllm serve`, so a bad file is reported in well under a
second (a tiny file) instead of at the end of a traceback after vLLM's start-up.
"""
from __future__ import annotations

import sys


def problem(model: str, speculative_config: str | dict | None = None) -> str | None:
    """The one-line error the shim would raise for `model` (and its --speculative-config value, JSON text or a dict)
    when vLLM builds its config, or None."""
    from glm5_shim.loading.hf_config import config_dict_from_gguf, is_glm_dsa_gguf, refuse_unreadable_gguf
    from glm5_shim.loading.mtp import mtp_problem_for_speculative_config
    from glm5_shim.gguf.errors import GGUFError

    try:
        if is_glm_dsa_gguf(model):
            config_dict_from_gguf(model)
        else:
            refuse_unreadable_gguf(model)  # a *.gguf that is no readable GGUF; other files pass through
    except GGUFError as exc:
        return str(exc)
    return mtp_problem_for_speculative_config(speculative_config, model)


_USAGE = "usage: python -m glm5_shim.preflight MODEL [--speculative-config JSON]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    speculative = None
    if len(args) == 3 and args[1] == "--speculative-config":
        args, speculative = args[:1], args[2]
    if len(args) != 1:  # not 2: that exit status means "this model has a problem"
        print(_USAGE, file=sys.stderr)
        return 64
    line = problem(args[0], speculative)
    if line is None:
        return 0
    print(line, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
