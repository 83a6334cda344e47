#!/usr/bin/env bash
# #47, call 2 of 3 (on the warm machine of call 1: its llama.cpp build and slices are reused): the peer on the same full-depth ranks and GPU: llama.cpp's CUDA build (sm_90, FA kernels
# not built) — llama-bench, llama-batched-bench, llama-server at 1 and 8 streams — on plain copies of the
# --shared-data slices slice_serve serves (Q4_K_M in /dev/shm when it has room, UD-IQ2_M-like likewise or on disk).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date; nvidia-smi -L; df -h / /tmp /dev/shm; free -g; } > "$OUT/machine_b.txt" 2>&1
if [[ ! -f /tmp/vllm_site/env.sh ]]; then
  bash .gpu/bundle_slim/install.sh > /tmp/bundle_install.log 2>&1 || { tail -30 /tmp/bundle_install.log > "$OUT/peer.log"; exit 1; }
fi
source /tmp/vllm_site/env.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ ! -x /tmp/llamacpp-build/bin/llama-server ]]; then
  JOBS=16 timeout 420 bash bench/llama_bench.sh build .gpu/llamacpp > "$OUT/llama_build_b.txt" 2>&1
fi
mkdir -p /tmp/peer
SERVER_TIMEOUT=200 timeout $((585 - SECONDS)) bash bench/llama_bench.sh peer /tmp/peer/peer.md ${PEER_NAMES:-r8-Q4_K_M-78L r8-IQ2_M-78L}
cp /tmp/peer/peer.md /tmp/peer/peer.md.log "$OUT/" 2>/dev/null
for d in /tmp/peer/server-*; do cp "$d/llama_server.json" "$OUT/$(basename "$d").json" 2>/dev/null; done
tail -c 20000 /tmp/peer/server-r8-Q4_K_M-78L/llama_server.log > "$OUT/llama_server_q4.log" 2>/dev/null
