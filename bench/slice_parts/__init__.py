"""bench/slice_serve.py's parts (the script is the entry point; see its docstring for what a run does).

  kernels   kernel name → category (the issue's groups), a torch-profiler chrome trace grouped per step
  hostmem   peak host RSS of a server's process tree, sampled in a thread
  measure   what one server is asked: decode / prefill throughput, first-token log-probs, a profiled window
  parts     the parts (a)–(f), in priority order; slices made on the device; servers started and stopped
  report    DIR/slice.md from DIR/slice.json
"""
