#!/usr/bin/env bash
# llama.cpp's own llama-bench (CUDA, sm_90) on a GLM-5 slice, next to bench/slice_serve.py's numbers (issue #16).
#
#   bash bench/llama_bench.sh prepare [SDIST_DIR] [DEST]   on this machine: copy the llama.cpp tree vendored in the
#        llama-cpp-python sdist (default /tmp/lcp/llama_cpp_python-0.3.36) into DEST (default .gpu/llamacpp), trimmed
#        to what a CUDA build of llama-bench needs (ggml with its CPU and CUDA backends, src, include, common,
#        vendor, cmake, tools/llama-bench, tools/batched-bench); prints its size (carry it: about 17 MiB)
#   bash bench/llama_bench.sh build [DEST]                 on the GPU machine: cmake + ninja, GGML_CUDA=ON,
#        CMAKE_CUDA_ARCHITECTURES=90, only the llama-bench and llama-batched-bench targets (BUILD_DIR, default
#        /tmp/llamacpp-build; JOBS parallel compiles, default all cores); the
#        FlashAttention kernels (most of the template instances) compile as empty stubs (GGML_CUDA_FA=OFF: llama.cpp
#        then attends without FA) unless BUILD_FA=ON, to fit the build in a device call; cuBLAS from the nvidia wheels when the toolkit is nvcc alone (run it after
#        sourcing /tmp/vllm_site/env.sh); CONFIGURE_ONLY=1 stops after cmake
#   bash bench/llama_bench.sh run SLICE.gguf [ARGS...]     llama-bench on the slice: all layers on the GPU,
#        prompt 2048 and 128 generated tokens by default (LLAMA_BENCH_ARGS replaces "-p 2048 -n 128 -r 3"), markdown
#        to stdout
#   bash bench/llama_bench.sh batched SLICE.gguf [ARGS...] llama-batched-bench: NPL parallel sequences (default
#        1,8,32), each its own NPP-token prompt (default 2048) then NTG generated tokens (default 128), all layers on
#        the GPU; prints its table (S_TG t/s: generated tokens/s over all sequences, what slice_serve calls decode
#        tok/s at that concurrency)
#   bash bench/llama_bench.sh slices OUT.md [NAME ...]    both benchmarks on bench/slice_serve.py's slices (default
#        r8-Q4_K_M r8-IQ2_M), made in SLICE_DIR (default /tmp/slices, slice_serve's) unless there: the same bytes
#        (seed 0) slice_serve serves; markdown to OUT.md (LLAMA_BATCHED_ARGS: more llama-batched-bench arguments;
#        on a CPU build both need their repacking off: LLAMA_BENCH_ARGS "... --repack 0", LLAMA_BATCHED_ARGS "-nr")
# In a device call, e.g. with carry [".gpu/bundle_slim", ".whl", ".gpu/llamacpp"]:
#   bash bench/llama_bench.sh build && python -m glm5_shim make-slice /tmp/s.gguf --layers 4 --dense-layers 1 \
#     --preset Q4_K_M --rank-of 8 --quiet && bash bench/llama_bench.sh run /tmp/s.gguf > $OUT/llama_bench.md
set -euo pipefail
cmd=${1:-}; shift || true
here=$(cd "$(dirname "$0")" && pwd)

# the slice bench/slice_serve.py serves under NAME (made in SLICE_DIR, default /tmp/slices, unless there): its path
# and the bytes of its tensors (a --shared-data file loads as more than it holds)
slice_file() {
  (cd "$here" && python3 -c "import sys; from pathlib import Path; from slice_parts.parts import make_slice_file as m; \
info = m(sys.argv[1], Path(sys.argv[2])); print(info['path'], info['bytes'])" "$1" "${SLICE_DIR:-/tmp/slices}")
}

# llama-bench (with the arguments given) and llama-batched-bench on one file, as markdown
both_benches() {
  echo "llama-bench $2:"; echo
  LLAMA_BENCH_ARGS=$2 bash "$0" run "$1" 2>&1 | grep -v "^ggml_\|^load\|^print_info\|^llama_"; echo
  echo "llama-batched-bench, npp ${NPP:-2048} ntg ${NTG:-128} npl ${NPL:-1,8,32}:"; echo
  # shellcheck disable=SC2086
  bash "$0" batched "$1" ${LLAMA_BATCHED_ARGS:-} 2>&1 | grep -E "^\||^main:|error|failed"; echo
}
case "$cmd" in
  prepare)
    src=${1:-/tmp/lcp/llama_cpp_python-0.3.36}/vendor/llama.cpp
    dest=${2:-.gpu/llamacpp}
    [[ -f "$src/CMakeLists.txt" ]] || { echo "no llama.cpp tree at $src" >&2; exit 2; }
    rm -rf "$dest"; mkdir -p "$dest/tools" "$dest/ggml/src" "$dest/scripts"
    cp "$src/CMakeLists.txt" "$src/LICENSE" "$dest/"
    cp -r "$src/cmake" "$src/include" "$src/src" "$src/common" "$src/vendor" "$dest/"
    cp "$src/scripts/ui-assets.cmake" "$dest/scripts/"
    cp -r "$src/tools/llama-bench" "$src/tools/batched-bench" "$src/tools/server" "$src/tools/mtmd" "$dest/tools/"
    # the server's web UI: its CMake and templates only (no npm, no download: an empty asset table is embedded)
    mkdir -p "$dest/tools/ui"
    cp "$src"/tools/ui/{CMakeLists.txt,ui.cpp.in,ui.h.in,sources.cmake} "$dest/tools/ui/" 2>/dev/null || \
      cp "$src"/tools/ui/{CMakeLists.txt,ui.cpp.in,ui.h.in} "$dest/tools/ui/"
    rm -rf "$dest/tools/server/tests" "$dest/tools/server/bench"
    # tools/CMakeLists.txt: the two benchmarks, and the server with what it links (ui, mtmd)
    printf '%s\n' 'add_subdirectory(llama-bench)' 'add_subdirectory(batched-bench)' 'add_subdirectory(ui)' \
      'add_subdirectory(mtmd)' 'add_subdirectory(server)' > "$dest/tools/CMakeLists.txt"
    cp "$src/ggml/CMakeLists.txt" "$dest/ggml/"
    cp -r "$src/ggml/cmake" "$src/ggml/include" "$dest/ggml/"
    find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$dest/ggml/src/" \;
    cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dest/ggml/src/"
    # ggml/src/CMakeLists.txt adds every backend directory by name, guarded by its option (all OFF but CPU, CUDA)
    du -sh "$dest"
    # what travels: one xz tarball (the build step unpacks it), a few MiB beside the vLLM bundle
    tar -C "$(dirname "$dest")" -cJf "$dest.tar.xz" "$(basename "$dest")" && rm -rf "$dest"
    du -sh "$dest.tar.xz"
    ;;
  build)
    dest=${1:-.gpu/llamacpp}; build=${BUILD_DIR:-/tmp/llamacpp-build}
    if [[ ! -d "$dest" && -f "$dest.tar.xz" ]]; then
      mkdir -p /tmp/llamacpp-src && tar -C /tmp/llamacpp-src -xJf "$dest.tar.xz" && dest=/tmp/llamacpp-src/$(basename "$dest")
    fi
    export PATH="/usr/local/cuda/bin:$PATH"
    t0=$SECONDS
    cublas=()
    cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
    if ! ls "$cuda_root"/lib64/libcublas.so* "$cuda_root"/targets/*/lib/libcublas.so* > /dev/null 2>&1; then
      # a pip-installed toolkit (nvcc without cuBLAS): take cuBLAS from the nvidia wheels torch brought
      nv=$(python3 -c 'import nvidia, os; print(nvidia.__path__[0])' 2>/dev/null || true)
      lib=$( (ls -d "$nv"/cu13/lib "$nv"/cublas/lib 2>/dev/null || true) | head -1)
      [[ -n "$lib" ]] || { echo "no cuBLAS found (toolkit or nvidia wheels)" >&2; exit 1; }
      mkdir -p "$build/cublas"
      ln -sf "$(ls "$lib"/libcublas.so.* | head -1)" "$build/cublas/libcublas.so"
      ln -sf "$(ls "$lib"/libcublasLt.so.* | head -1)" "$build/cublas/libcublasLt.so"
      inc=$(dirname "$lib")/include
      cublas=(-DCUDA_cublas_LIBRARY="$build/cublas/libcublas.so" -DCUDA_cublasLt_LIBRARY="$build/cublas/libcublasLt.so"
              -DCMAKE_CUDA_FLAGS="-I$inc" -DCMAKE_CXX_FLAGS="-I$inc" -DCMAKE_C_FLAGS="-I$inc")
    fi
    # libcuda: the driver's own (a pip toolkit has no stubs); without one, no VMM pool (the legacy pool instead)
    libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF; exit}')
    if [[ -z "$(ls "$cuda_root"/lib64/stubs/libcuda.so 2>/dev/null)" ]]; then
      if [[ -n "$libcuda" ]]; then cublas+=(-DCUDA_cuda_driver_LIBRARY="$libcuda"); else cublas+=(-DGGML_CUDA_NO_VMM=ON); fi
    fi
    cmake -S "$dest" -B "$build" -G Ninja "${cublas[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF -DGGML_CUDA_FA="${BUILD_FA:-OFF}" -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > "$build.cmake.log" 2>&1 \
      || { tail -30 "$build.cmake.log"; exit 1; }
    [[ -z "${CONFIGURE_ONLY:-}" ]] || { echo "configured in $((SECONDS - t0)) s: $build"; exit 0; }
    cmake --build "$build" --target llama-bench llama-batched-bench llama-server -j "${JOBS:-$(nproc)}" > "$build.build.log" 2>&1 \
      || { grep -m5 -B2 -A8 "error" "$build.build.log"; tail -5 "$build.build.log"; exit 1; }
    echo "llama-bench, llama-batched-bench and llama-server built in $((SECONDS - t0)) s: $build/bin"
    ;;
  run)
    model=${1:?SLICE.gguf}; shift || true
    bin=${BUILD_DIR:-/tmp/llamacpp-build}/bin/llama-bench
    # shellcheck disable=SC2086
    "$bin" -m "$model" -ngl 999 ${LLAMA_BENCH_ARGS:--p 2048 -n 128 -r 3} -o md "$@"
    ;;
  batched)
    model=${1:?SLICE.gguf}; shift || true
    bin=${BUILD_DIR:-/tmp/llamacpp-build}/bin/llama-batched-bench
    npp=${NPP:-2048}; ntg=${NTG:-128}; npl=${NPL:-1,8,32}
    # the context holds every sequence's prompt and output (no shared prompt)
    ctx=$(( (npp + ntg) * $(tr ',' '\n' <<< "$npl" | sort -n | tail -1) ))
    "$bin" -m "$model" -ngl 999 -c "$ctx" -b 2048 -ub 512 -npp "$npp" -ntg "$ntg" -npl "$npl" "$@"
    ;;
  slices)
    out=${1:?OUT.md}; shift || true
    names=("$@"); (( ${#names[@]} )) || names=(r8-Q4_K_M r8-IQ2_M)
    for name in "${names[@]}"; do
      read -r path _ < <(slice_file "$name") || exit 1
      { echo "## $name ($path)"; echo; both_benches "$path" "${LLAMA_BENCH_ARGS:--p 2048 -n 128 -r 3}"; } >> "$out"
    done
    ;;
  peer)
    # the peer on the full-depth slices (issue #47): for each NAME (default r8-Q4_K_M-78L r8-IQ2_M-78L), the
    # --shared-data slice slice_serve serves (made in SLICE_DIR unless there), its plain copy in PLAIN_DIR (default
    # /dev/shm when it has room, else /tmp: llama.cpp reads tensor data only in order), then llama-bench,
    # llama-batched-bench and llama-server (bench/llama_server.py, 1 and 8 streams) on it; the copy is removed after.
    # Markdown to OUT.md, llama-server's JSON beside it.
    out=${1:?OUT.md}; shift || true
    names=("$@"); (( ${#names[@]} )) || names=(r8-Q4_K_M-78L r8-IQ2_M-78L)
    for name in "${names[@]}"; do
      read -r shared rank_bytes < <(slice_file "$name") || exit 1
      need=$((rank_bytes + (2 << 30)))
      dir=${PLAIN_DIR:-}
      if [[ -z "$dir" ]]; then
        dir=/tmp; (( $(df -B1 --output=avail /dev/shm | tail -1) > need )) && dir=/dev/shm
      fi
      plain=$dir/$name-plain.gguf
      if (( $(df -B1 --output=avail "$dir" | tail -1) < need )) && [[ ! -f "$plain" ]]; then
        echo "## $name: no room for its plain copy ($need bytes) in $dir" >> "$out"; continue
      fi
      t=$SECONDS
      [[ -f "$plain" ]] || python3 -m glm5_shim make-slice "$plain" --plain-copy-of "$shared" --quiet >> "$out.log" 2>&1 \
        || { echo "## $name: plain copy failed"; tail -3 "$out.log"; } >> "$out"
      { echo "## $name ($plain, plain copy of $shared: $((SECONDS - t)) s)"; echo
        both_benches "$plain" "${LLAMA_BENCH_ARGS:--p 2048 -n 128 -r 2}"; } >> "$out"
      # SERVER_ARGS: more bench/llama_server.py arguments, a shell line (quotes kept: --extra "-fa on")
      (eval "set -- ${SERVER_ARGS:-}"; timeout "${SERVER_TIMEOUT:-240}" python3 "$here/llama_server.py" "$plain" \
        --out "$(dirname "$out")/server-$name" --bin "${BUILD_DIR:-/tmp/llamacpp-build}/bin/llama-server" --slots 8 \
        --concurrency 1,8 "$@" >> "$out.log" 2>&1)
      { echo "llama-server, 8 slots:"; echo; sed -n '5,$p' "$(dirname "$out")/server-$name/llama_server.md" 2>/dev/null \
          || echo "(no result: see $out.log)"; echo; } >> "$out"
      [[ -n "${KEEP_PLAIN:-}" ]] || rm -f "$plain"
    done
    ;;
  *)
    sed -n 2,25p "$0"; exit 2 ;;
esac
