"""Check a glm-dsa GGUF before loading it in vLLM 0.23, from headers, names and shapes only (no tensor data).

`validate(path)` returns every problem found; `check(path)` raises GGUFError with the first error.

Levels:
  error    the file is malformed, is not GLM-5, or holds something vLLM 0.23 cannot run (an MTP-only file, llama.cpp's
           `convert_hf_to_gguf.py --mtp`, is one error line saying so)
  warning  the loader has to work around it (or it is harmless): mixed fused groups, differing gate/up
           expert types, float routed experts, problems confined to the MTP block, which the target model skips
           (they stop only an MTP draft: glm5_shim.gguf.load_plan.mtp_draft_problem; one line when the metadata
           declares the block but none of its tensors is there), stray tensors

Which types a tensor may have, and which of them the loader works around, is glm5_shim.gguf.type_policy's: the
same rules the load plan applies (the cross-tensor ones are read off the plan itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import build_hf_config, config_shape_problems, indexer_layout, mtp_block_absent
from .errors import GGUFError
from .reader import GLM_DSA_ARCH, GGUFModel, open_gguf
from .llama_tools import layer_of
from .load_plan import plan_tensors
from .tensor_map import ROLE_SHARED_INDEXER, TensorMap, build_tensor_map, known_unused_tensor
from .type_policy import row_problem, treatment

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    level: str  # ERROR or WARNING
    message: str  # one line, naming the file and the tensor or key
    tensor: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def validate(path: str | Path) -> list[Finding]:
    """Every problem found in the model at `path` (single file or any shard of a split model)."""
    try:
        model = open_gguf(path, expected_architecture=GLM_DSA_ARCH)
    except GGUFError as exc:
        return [Finding(ERROR, str(exc))]
    return validate_model(model)


def check(path: str | Path) -> list[Finding]:
    """Raise GGUFError with the first error; return the warnings when there is none."""
    findings = validate(path)
    for finding in findings:
        if finding.level == ERROR:
            raise GGUFError(finding.message)
    return findings


def validate_model(model: GGUFModel) -> list[Finding]:
    findings: list[Finding] = []
    try:
        config = build_hf_config(model, check_shapes=False)
    except GGUFError as exc:
        return [Finding(ERROR, str(exc))]
    mtp_only = _mtp_only_finding(model, config)
    if mtp_only is not None:  # every trunk tensor would be "missing": one line says what the file is instead
        return [mtp_only]
    findings += [Finding(ERROR, message) for message in config_shape_problems(model, config)]
    findings += _metadata_findings(model, config)

    tensor_map = build_tensor_map(config, include_mtp=True)
    findings += _without_mtp_block(model, tensor_map, _presence_findings(model, tensor_map))
    findings += _shared_indexer_findings(model, tensor_map)
    for info in model:
        spec = tensor_map.get(info.name)
        if spec is not None and spec.role != ROLE_SHARED_INDEXER:
            findings += _tensor_findings(model, info, spec)
    findings += _group_findings(model, config)
    return findings


def _metadata_findings(model: GGUFModel, config: dict) -> list[Finding]:
    out = []
    path, arch, md = model.path, model.architecture, model.metadata
    # The MQA view llama.cpp runs MLA as: key_length = kv_lora + rope, value_length = kv_lora.
    if f"{arch}.attention.key_length_mla" in md:
        for suffix, expected in (("attention.key_length", config["kv_lora_rank"] + config["qk_rope_head_dim"]),
                                 ("attention.value_length", config["kv_lora_rank"])):
            key = f"{arch}.{suffix}"
            if key in md and md[key] != expected:
                out.append(Finding(WARNING, f"{path}: metadata key {key} is {md[key]}, expected {expected} "
                                            f"(llama.cpp's MLA-as-MQA size); ignored by the shim", key=key))
    if md.get("tokenizer.ggml.model") != "gpt2" or "tokenizer.ggml.tokens" not in md:
        out.append(Finding(WARNING, f"{path}: metadata key tokenizer.ggml.model is {md.get('tokenizer.ggml.model')!r}"
                                    f", expected 'gpt2' with tokenizer.ggml.tokens: the tokenizer cannot be built "
                                    f"from this file", key="tokenizer.ggml.model"))
    elif "tokenizer.ggml.merges" not in md:
        out.append(Finding(WARNING, f"{path}: metadata key tokenizer.ggml.merges is missing: the BPE tokenizer cannot "
                                    f"be built from this file", key="tokenizer.ggml.merges"))
    return out


def _presence_findings(model: GGUFModel, tensor_map: TensorMap) -> list[Finding]:
    out = []
    path = model.path
    layout = None
    for spec in tensor_map.missing(model.tensors):
        level = WARNING if spec.is_mtp else ERROR
        why = ""
        if ".indexer." in spec.gguf_name and not spec.is_mtp:
            layout = layout or indexer_layout(model, tensor_map.config["num_hidden_layers"])
            why = f"; layer {spec.layer} runs its own DSA indexer: {layout.source}"
        out.append(Finding(level, f"{path}: tensor {spec.gguf_name} is missing (expected shape {list(spec.shape)}, "
                                  f"loaded as {spec.hf_name}{why})", tensor=spec.gguf_name))
    for info in model:
        if info.name in tensor_map:
            continue
        if known_unused_tensor(info.name):
            out.append(Finding(WARNING, f"{info.path}: tensor {info.name} is not used by GLM-5 and will be ignored",
                               tensor=info.name))
        else:
            out.append(Finding(ERROR, f"{info.path}: tensor {info.name} is unexpected in a glm-dsa model "
                                      f"(type {info.type_name}, shape {list(info.shape)})", tensor=info.name))
    return out


def _mtp_layers(config: dict) -> range:
    return range(config["num_hidden_layers"], config["num_hidden_layers"] + config["num_nextn_predict_layers"])


def _mtp_only_finding(model: GGUFModel, config: dict) -> Finding | None:
    """An MTP-only GGUF (llama.cpp's `convert_hf_to_gguf.py --mtp`: nextn_predict_layers > 0, the MTP block and the
    embeddings, no trunk block): one error instead of one "missing" line per trunk tensor.  llama.cpp recognises
    such a file by its missing blk.0.attn_norm.weight; here no tensor of any trunk block may be present (a trunk with
    a few tensors missing is a broken main model, reported tensor by tensor)."""
    if not config["num_nextn_predict_layers"]:
        return None
    layers = {layer_of(name) for name in model.tensors} - {None}
    mtp = [layer for layer in _mtp_layers(config) if layer in layers]
    if not mtp or any(layer < config["num_hidden_layers"] for layer in layers):
        return None
    blocks = " ".join(f"blk.{layer}" for layer in mtp)
    return Finding(ERROR, f"{model.path}: this is an MTP-only GGUF (llama.cpp convert --mtp: only the nextn block "
                          f"{blocks} and the embeddings); serve the main model file, MTP drafts come from a file that "
                          f"holds its MTP layer with the trunk (--speculative-config method mtp), not from a "
                          f"separate --mtp file", key=f"{model.architecture}.nextn_predict_layers")


def _without_mtp_block(model: GGUFModel, tensor_map: TensorMap, findings: list[Finding]) -> list[Finding]:
    """A file that declares nextn_predict_layers > 0 but holds none of the MTP block's tensors (llama.cpp loads it as
    "trunk-only": no blk.{n_layer}.nextn.eh_proj.weight): one warning instead of one per MTP tensor; the loader
    skips that block anyway.  Findings of a partly present MTP block are kept as they are."""
    config = tensor_map.config
    if not mtp_block_absent(model, config):
        return findings
    absent = [f for f in findings if f.level == WARNING and f.tensor is not None and f.tensor not in model.tensors
              and (spec := tensor_map.get(f.tensor)) is not None and spec.is_mtp]
    if not absent:
        return findings
    blocks = " ".join(f"blk.{layer}" for layer in _mtp_layers(config))
    key = f"{model.architecture}.nextn_predict_layers"
    note = Finding(WARNING, f"{model.path}: metadata key {key} is {config['num_nextn_predict_layers']} but the "
                            f"multi-token-prediction block {blocks} has no tensors here (a trunk-only file, e.g. "
                            f"stripped of its MTP draft); the model serves without MTP speculative decoding", key=key)
    return [note] + [f for f in findings if f not in absent]


def _shared_indexer_findings(model: GGUFModel, tensor_map: TensorMap) -> list[Finding]:
    """Indexer tensors in layers that share the previous full layer's top-k: one warning for the file."""
    present = [info for info in model if (spec := tensor_map.get(info.name)) and spec.role == ROLE_SHARED_INDEXER]
    if not present:
        return []
    layers = sorted({tensor_map.get(info.name).layer for info in present})
    shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
    return [Finding(WARNING, f"{model.path}: {len(present)} indexer tensors (e.g. {present[0].name}) belong to "
                             f"{len(layers)} shared-indexer layer(s) ({shown}), which reuse the previous full "
                             f"layer's top-k; they are ignored", tensor=present[0].name)]


def _tensor_findings(model: GGUFModel, info, spec) -> list[Finding]:
    out = []
    where = f"{info.path}: tensor {info.name}"
    if info.shape != spec.shape:
        out.append(Finding(ERROR, f"{where}: expected shape {list(spec.shape)} (from the metadata), "
                                  f"found {list(info.shape)}", tensor=info.name))
        return out
    problem = row_problem(info)
    if problem is not None:  # the file itself is malformed: an error in the MTP block too
        out.append(Finding(ERROR, f"{where}: {problem}", tensor=info.name))
        return out

    decided = treatment(spec, info)
    if decided.refused:
        # The target model skips the MTP block, so type problems there stop only an MTP draft (mtp_draft_problem).
        out.append(Finding(WARNING if spec.is_mtp else ERROR, f"{where}: {decided.reason}", tensor=info.name))
    elif decided.warn:
        out.append(Finding(WARNING, f"{where}: {decided.reason}", tensor=info.name))
    return out


def _group_findings(model: GGUFModel, config: dict) -> list[Finding]:
    """The load plan's cross-tensor rules (type_policy.settle_groups): fused groups made one precision, gate/up
    experts made one type; a tensor such a rule cannot convert is an error."""
    return [Finding(ERROR if note.refused else WARNING, f"{model.path}: {note.message}", tensor=note.tensor)
            for note in plan_tensors(model, config).group_notes]
