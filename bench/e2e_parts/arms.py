"""What is served: an arm is a model (Q8_0 or Q4_K tiny GGUF) × attention path (shim / native) × KV-cache dtype;
the tiny models' shape and the limits every server runs with."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SHIM_ENV = {"GLM5_SHIM_ATTENTION": "triton", "GLM5_SHIM_INDEXER": "triton"}
MODEL_ARGS = dict(layers=3, heads=16, index_heads=32, index_topk=128)  # heads 16: 8 a rank at TP 2
MAX_MODEL_LEN = 4096
GEN_TOKENS = 48


@dataclass
class Arm:
    name: str
    quant: str
    kv: str  # auto | fp8_ds_mla
    path: str  # shim | native
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path | None = None
    model: str = ""
    startup_s: float = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_SHIM_")}
        if self.path == "shim":
            env.update(SHIM_ENV)
            # the consumer GPUs' kernel code on this Hopper GPU (kernels/consumer.py, issue #52): shim arms only
            if os.environ.get("GLM5_SHIM_CONSUMER_PTX"):
                env["GLM5_SHIM_CONSUMER_PTX"] = os.environ["GLM5_SHIM_CONSUMER_PTX"]
        return env


def all_arms() -> list[Arm]:
    arms = []
    for quant, kv in (("Q8_0", "auto"), ("Q8_0", "fp8_ds_mla"), ("Q4_K", "auto")):
        for path in ("shim", "native"):
            tag = f"{quant.lower().replace('_', '')}-{'bf16' if kv == 'auto' else 'fp8'}"
            arms.append(Arm(f"{path}-{tag}", quant, kv, path))
    return arms
