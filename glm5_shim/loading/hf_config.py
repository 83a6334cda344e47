"""GLM-5's Hugging Face config for vLLM, built from a glm-dsa GGUF's metadata.

transformers < 5.2 (what `pip install vllm==0.23.0` resolves: 4.57.6) has no GlmMoeDsaConfig; vLLM's model code
only reads attributes, so a DeepseekV3Config subclass with model_type "glm_moe_dsa" carries every field.  With
transformers >= 5.2 its own class is used.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from glm5_shim.names import GGUF_ARCH as GLM_GGUF_ARCH, HF_MODEL_TYPE as GLM_MODEL_TYPE

_class = None


class PerFileCache:
    """One value per GGUF file version (path, size, mtime) and process.  The value is built outside the lock: a real
    GLM-5 header takes seconds to parse, and building may itself use another cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple, object] = {}

    def get(self, path: str | os.PathLike, build):
        key = file_version(path)
        with self._lock:
            if key in self._values:
                return self._values[key]
        value = build()
        with self._lock:
            return self._values.setdefault(key, value)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


_models = PerFileCache()  # parsed GGUF headers, shared by the config, the TP split check and the load plan
_configs = PerFileCache()  # validated config dicts


def glm_moe_dsa_config_class():
    global _class
    if _class is not None:
        return _class
    try:
        from transformers import GlmMoeDsaConfig as cls  # transformers >= 5.2
    except ImportError:
        from glm5_shim.loading.transformers4_config import GlmMoeDsaConfig as cls
    _class = cls
    return cls


def register_config_class(vllm_config_registry) -> object:
    """Make `glm_moe_dsa` resolvable by vLLM and by AutoConfig (also for --hf-config-path on transformers 4.x)."""
    from transformers import AutoConfig

    cls = glm_moe_dsa_config_class()
    if GLM_MODEL_TYPE not in vllm_config_registry:
        vllm_config_registry[GLM_MODEL_TYPE] = cls
    try:
        AutoConfig.register(GLM_MODEL_TYPE, cls, exist_ok=True)
    except (TypeError, ValueError):
        pass  # already registered natively
    # A tokenizer directory with a GLM-5 config.json but no tokenizer_config.json (e.g. --tokenizer pointing at
    # a checkpoint folder) makes AutoTokenizer look the config class up: give it the fast tokenizer.
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        AutoTokenizer.register(cls, fast_tokenizer_class=PreTrainedTokenizerFast, exist_ok=True)
    except (TypeError, ValueError):
        pass
    return cls


def is_glm_dsa_gguf(model: str | os.PathLike) -> bool:
    from glm5_shim.gguf.probe import gguf_architecture

    return gguf_architecture(model) == GLM_GGUF_ARCH


def refuse_unreadable_gguf(model) -> None:
    """A local *.gguf that is not a readable GGUF gets the reader's one-line error, not a transformers
    traceback.  Readable GGUFs of other architectures are left to vLLM."""
    from glm5_shim.gguf.probe import gguf_architecture

    path = Path(str(model))
    if path.suffix == ".gguf" and path.is_file() and gguf_architecture(path) is None:
        from glm5_shim.gguf.reader import open_gguf

        open_gguf(path, expected_architecture=None)  # raises GGUFError naming the file and the problem


def file_version(path: str | os.PathLike) -> tuple[str, int, int]:
    """(resolved path, size, mtime): what the per-process caches and the tokenizer cache are keyed by."""
    p = Path(path).resolve()
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns)


def gguf_model(path: str | os.PathLike):
    """open_gguf once per file version and process: a real GLM-5 header (154,880-token vocabulary) takes seconds
    to parse, and the config, the TP split check and the load plan all need it.  forget_gguf_models() drops them."""
    from glm5_shim.gguf.reader import open_gguf

    return _models.get(path, lambda: open_gguf(path))  # the name as given: errors name the file the user passed


def forget_gguf_models() -> None:
    _models.clear()


def config_dict_from_gguf(path: str | os.PathLike) -> dict:
    """Validated HF config fields of a glm-dsa GGUF (cached per file version).  A bad file raises GGUFError,
    one line naming the file and the tensor or key, before anything touches a GPU."""
    return dict(_configs.get(path, lambda: _validated_config(path)))


def _validated_config(path: str | os.PathLike) -> dict:
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.validate import ERROR, validate_model

    model = gguf_model(path)
    findings = validate_model(model)
    errors = [f for f in findings if f.level == ERROR]
    if errors:
        from glm5_shim.gguf.errors import GGUFError

        more = (f" (and {len(errors) - 1} more problem(s): python -m glm5_shim inspect {path})"
                if len(errors) > 1 else "")
        raise GGUFError(errors[0].message + more)
    return build_hf_config(model)


def config_from_gguf(path: str | os.PathLike):
    cls = glm_moe_dsa_config_class()
    fields = config_dict_from_gguf(path)
    return cls(**fields)


def generation_config_from_gguf(path: str | os.PathLike):
    """GLM-5 stops a turn on <|endoftext|>, <|user|> or <|observation|>: all of them must be stop tokens."""
    from transformers import GenerationConfig

    fields = config_dict_from_gguf(path)
    kwargs = {k: fields[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if fields.get(k) is not None}
    return GenerationConfig(**kwargs)
