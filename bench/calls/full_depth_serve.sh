#!/usr/bin/env bash
# #47, call 1 of 3: the full-depth rank-of-8 Q4_K_M (78 layers + MTP, --shared-data) served through launch.sh
# (parts F: 2k prompts, 1-32 streams, profiles at 1 and 8; F32k: 32k prompts on the same server); llama.cpp
# (llama-bench, llama-batched-bench, llama-server for sm_90) built beside it at nice 19 on 8 of the 16 cores.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date; nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  df -h / /tmp /dev/shm; free -g; nproc; } > "$OUT/machine.txt" 2>&1
if [[ ! -f /tmp/vllm_site/env.sh ]]; then
  bash .gpu/bundle_slim/install.sh > /tmp/bundle_install.log 2>&1 || { tail -30 /tmp/bundle_install.log > "$OUT/session.log"; exit 1; }
fi
source /tmp/vllm_site/env.sh
(nice -n 19 env JOBS=8 bash bench/llama_bench.sh build .gpu/llamacpp > /tmp/llama_build.out 2>&1
 echo "exit $?" >> /tmp/llama_build.out) &
BUILD_PID=$!
SLICE_TIMEOUT=$((560 - SECONDS)) SLICE_ARGS="--parts F,F32k --start-timeout 480" bash bench/gpu_session.sh slice
# the build: give it what is left of the call (ninja keeps its progress for the next call otherwise)
left=$((590 - SECONDS)); (( left > 5 )) && timeout "$left" tail --pid=$BUILD_PID -f /dev/null
{ cat /tmp/llama_build.out; tail -3 /tmp/llamacpp-build.build.log; } > "$OUT/llama_build.txt" 2>&1
du -sh /tmp/slices/* >> "$OUT/machine.txt" 2>&1
