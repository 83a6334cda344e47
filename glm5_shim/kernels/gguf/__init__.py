"""The shim's GGUF matmul kernels: what they read, how a call is routed, the kernels, their references.

  traits        one record per GGML type (block, grid, packed layout, which kernels compute it); every per-type
                list is derived from it.  Pure (imports gguf only)
  routing       which kernel a call runs on, and when vLLM's own ggml kernels keep it: the measured thresholds
                and the facts about vLLM 0.23's GGUF kernels the rules need.  Pure
  tiles         Triton tile kernels for every type (linears, MoE passes, dequantization) and the launch plans
  register_mma  Gluon register-MMA decode kernels (weights fed to tensor cores from registers) and the packed
                layouts repacked at load
  reference     float64 references and GGUF weights to test the kernels with

Importing this package imports nothing heavy; tiles and register_mma import torch and Triton.
"""
