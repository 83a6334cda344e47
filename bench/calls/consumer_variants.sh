#!/usr/bin/env bash
# issue #52: the GPU tests on the consumer variants (sm_89 fp8 plans of an RTX PRO 6000, sm_80 plans of an RTX 3090,
# assembled for this Hopper GPU; eight pytest processes at once, each compiling its own kernels), then the tiny end
# to end with the shim arms on sm_89 code.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CONSUMER_TIMEOUT=${CONSUMER_TIMEOUT:-330} bash bench/gpu_session.sh consumer
GLM5_SHIM_CONSUMER_PTX=89 E2E_ARGS="--arms shim-q80-bf16,native-q80-bf16 --skip-throughput --load-seconds 10" \
  E2E_TIMEOUT=$((570 - SECONDS)) bash bench/gpu_session.sh e2e
