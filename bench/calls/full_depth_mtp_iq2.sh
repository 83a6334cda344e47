#!/usr/bin/env bash
# #47, call 3 of 3: MTP K=1 and K=3 on the peaked full-depth rank-of-8 Q4_K_M (1 and 8 streams, acceptance
# from vLLM's counters), then the UD-IQ2_M-like full-depth rank (the shim beside call B's llama.cpp on that file).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [[ ! -f /tmp/vllm_site/env.sh ]]; then
  bash .gpu/bundle_slim/install.sh > /tmp/bundle_install.log 2>&1 || { tail -30 /tmp/bundle_install.log > "$OUT/session.log"; exit 1; }
fi
source /tmp/vllm_site/env.sh
SLICE_TIMEOUT=$((585 - SECONDS)) SLICE_ARGS="--parts ${C_PARTS:-FM1,FM3,FI} --start-timeout 420" \
  bash bench/gpu_session.sh slice
