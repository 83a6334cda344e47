#!/usr/bin/env bash
# glm5-shim launcher.
#
#   source launch.sh                     puts this repository on PYTHONPATH so that every Python process (vLLM's
#                                        engine core and workers included) activates the shim; nothing else.
#   ./launch.sh MODEL.gguf [ARGS...]     checks the GGUF's headers and that a CUDA GPU is visible (exit 2 with one line
#                                        if not), then runs `vllm serve MODEL.gguf` with the recommended flags;
#                                        ARGS pass through and win over the recommendations.
#   ./launch.sh doctor [MODEL.gguf]      the shim's doctor.

_glm5_shim_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case ":${PYTHONPATH:-}:" in
  *":${_glm5_shim_root}:"*) ;;
  *) export PYTHONPATH="${_glm5_shim_root}${PYTHONPATH:+:${PYTHONPATH}}" ;;
esac

# Sourced: stop here.
if [[ "${BASH_SOURCE[0]}" != "${0}" ]]; then
  unset _glm5_shim_root
  return 0
fi

set -euo pipefail
if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ "$1" == "doctor" ]]; then
  shift
  exec python -m glm5_shim doctor "$@"
fi

model="$1"; shift
if [[ ! -e "$model" && "$model" == *.gguf && "$model" != *:* ]]; then
  echo "launch.sh: model file not found: $model (expected a .gguf file, the first shard of a split GGUF)" >&2
  exit 2
fi

# A glm-dsa GGUF the shim cannot load: the shim's one-line error now, not at the end of a traceback after vLLM's
# start-up.  Same check as the shim's, from headers only (glm5_shim.preflight); anything that is not a local
# glm-dsa GGUF (another architecture, a repo id, a directory) passes through to vLLM.  gguf imports mistral_common
# (~0.5 s) only to convert Mistral tokenizers: kept out.
# GLM5_SHIM=0 (the shim off, as glm5_shim.settings.shim_enabled reads it): stock vLLM, no check.
shim_flag="${GLM5_SHIM:-}"; shim_flag="${shim_flag//[[:space:]]/}"; shim_flag="${shim_flag,,}"
# --speculative-config asking for an MTP draft is checked too: a file without its MTP layer is one line here.
speculative=(); prev=""
for arg in "$@"; do
  case "$prev" in --speculative-config|-sc) speculative=(--speculative-config "$arg") ;; esac
  case "$arg" in --speculative-config=*|-sc=*) speculative=(--speculative-config "${arg#*=}") ;; esac
  prev="$arg"
done
if [[ -f "$model" && ! "$shim_flag" =~ ^(0|false|no|off)$ ]]; then
  rc=0
  problem=$(python -c 'import sys; sys.modules["mistral_common"] = None
from glm5_shim.preflight import main; sys.exit(main(sys.argv[1:]))' "$model" "${speculative[@]}" 2>&1) || rc=$?
  if [[ $rc -eq 2 ]]; then
    echo "launch.sh: $problem" >&2
    exit 2
  elif [[ $rc -ne 0 ]]; then  # the check itself broke: say so, and leave the verdict to vLLM
    printf '%s\n' "$problem" >&2
    echo "launch.sh: WARNING: the GGUF check failed to run (exit $rc); starting vLLM anyway" >&2
  fi
fi

# vLLM serves on a CUDA GPU; without one it stops late with "Failed to infer device type".  Tests and CI put a
# stand-in nvidia-smi on PATH.
no_gpu_because() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    case "${CUDA_VISIBLE_DEVICES//[[:space:]]/}" in
      "" | -1 | -1,*) echo "CUDA_VISIBLE_DEVICES=\"$CUDA_VISIBLE_DEVICES\""; return ;;
    esac
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    # The driver without its utilities (a headless install, a container without the "utility" capability).
    compgen -G "/proc/driver/nvidia/gpus/*" >/dev/null || echo "nvidia-smi: not found"
    return
  fi
  local out rc=0 limit=()
  command -v timeout >/dev/null 2>&1 && limit=(timeout 60)
  out=$("${limit[@]}" nvidia-smi -L 2>&1) || rc=$?
  grep -q '^GPU [0-9]' <<<"$out" && return
  out="$(grep -m1 -v '^[[:space:]]*$' <<<"$out" || true)"
  echo "nvidia-smi: ${out:-no GPU listed, exit status $rc}"
}
gpu_problem="$(no_gpu_because)"
if [[ -n "$gpu_problem" ]]; then
  echo "launch.sh: no CUDA GPU visible ($gpu_problem); vLLM needs one to serve" >&2
  exit 2
fi

has_flag() { local f; for f in "${@:2}"; do [[ "$f" == "$1" || "$f" == "$1="* ]] && return 0; done; return 1; }
recommended=()
# The DSA indexer reserves a prefill workspace of max_model_len x 40 x 132 B and a decode logits buffer per
# request of max_model_len x 4 B: a modest context keeps start-up memory sane.  Pass your own to change it.
# A model whose own context is shorter gets its own (vLLM refuses a max-model-len above it).  probe.py is loaded
# alone: it only needs the standard library, so this costs ~30 ms, not an import of the package.
if ! has_flag --max-model-len "$@"; then
  max_len="${GLM5_MAX_MODEL_LEN:-32768}"
  ctx=$(python3 -c 'import importlib.util as u, sys
s = u.spec_from_file_location("glm5_probe", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)
print(m.context_length(sys.argv[2]) or "")' "${_glm5_shim_root}/glm5_shim/gguf/probe.py" "$model" 2>/dev/null || true)
  if [[ -z "${GLM5_MAX_MODEL_LEN:-}" && "$ctx" =~ ^[0-9]+$ && "$ctx" -lt "$max_len" ]]; then
    max_len="$ctx"
  fi
  recommended+=(--max-model-len "$max_len")
fi
# FlashInfer's sampler JIT-compiles with nvcc at run time; without a CUDA toolkit use the PyTorch sampler.
if ! command -v nvcc >/dev/null 2>&1 && [[ -z "${VLLM_USE_FLASHINFER_SAMPLER:-}" ]]; then
  export VLLM_USE_FLASHINFER_SAMPLER=0
fi

exec vllm serve "$model" "${recommended[@]}" "$@"
