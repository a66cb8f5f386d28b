"""The adapter you load is the adapter you saved (S10): save, load in a fresh process, and compare both with the
model the saved file's tensors give by the formulas, in float64.

A load whose keys do not match often runs without an error: the model then computes with the base weights, a fresh
head or a fresh adapter. So every leg here is a comparison with a reference computed by hand from the saved tensors
(never through peft's loading code):

- Linear LoRA: W + s B A (and the bias b + s b_B with `lora_bias`); DoRA: m (W + s B A) / ||W + s B A|| per output row;
- an Embedding's LoRA: E + s (B_e A_e)^T; trainable tokens: E's rows at the indices replaced by the saved rows;
- `modules_to_save`: the module's saved weights in place of the base's.

`s` is what the saving model used for each module (its `scaling`, recorded at save time: the model the user trained),
so the reference is the trained model, not any one peft release's reading of `alpha_pattern`.

The legs: the file against the saving model (`save`: does the file hold what was trained?), the loaded model against the
file's formula model (`load`), the loaded model merged (`merge_and_unload`) against it (`merge`), the loaded model
merged then unmerged, with its adapters disabled, against the base (`unmerge`: the base weights given back), and the
keys: each saved tensor found, by its values, in the loaded model under the module it was saved from, and no adapter
tensor of the loaded model left at values the file does not hold. Every adapter tensor carries noise from a generator
the loading process never replays, so a load that drops a key cannot regenerate its value from the global seed."""

from __future__ import annotations

import json
import os
from typing import Any

from scenarios.kit import identities, named_models

#: The words peft puts between a module's path and the adapter's name, in the model's parameter names.
PEFT_WORDS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector", "modules_to_save",
              "trainable_tokens_delta")  # fmt: skip
NOISE_SEED = 7919
LOAD_SEED = 4242
TRAIN_STEPS = 2
LR = 1e-2


# --- the saving side ------------------------------------------------------------------------------------------------


def lora_config(config: dict[str, Any], adapter: str) -> Any:
    """The adapter's LoraConfig from the config's axes (targets, embedding, output layer, head, tokens, bias, DoRA,
    rsLoRA, rank/alpha patterns); each adapter of a config gets the same targets, its own rank."""
    from peft import LoraConfig

    names = named_models.names_of(config)
    targets: Any = _targets_plain(config, names)
    if config.get("targets") == "regex":  # a regex string: peft matches it against each module's whole path
        import re

        targets = r"(.*\.)?(" + "|".join(re.escape(t) for t in targets) + ")"
    elif config.get("targets") == "all-linear":
        targets = "all-linear"
    extra: dict[str, Any] = {}
    if config.get("adapter") == "dora":
        extra["use_dora"] = True
    if config.get("rslora"):
        extra["use_rslora"] = True
    if config.get("lora_bias"):
        extra["lora_bias"] = True
    if config.get("modules_to_save"):
        extra["modules_to_save"] = named_models.heads_of(config)
    if config.get("trainable_tokens"):
        extra["trainable_token_indices"] = {names["embed"]: [1, 5, 9]}
    if config.get("patterns") == "rank":
        extra["rank_pattern"] = {names["v"]: 2}
    elif config.get("patterns") == "alpha":
        extra["alpha_pattern"] = {names["v"]: 4}
    rank = int(config.get("r", 8)) + 2 * list(config.get("adapters", ["default"])).index(adapter)
    task = {"task_type": "CAUSAL_LM"} if config.get("model") == "llama" else {}
    return LoraConfig(r=rank, lora_alpha=int(config.get("alpha", 16)), target_modules=targets, lora_dropout=0.0,
                      init_lora_weights=True, **task, **extra)  # fmt: skip


def _targets_plain(config: dict[str, Any], names: dict[str, str]) -> list[str]:
    found = [names["q"], names["v"]]
    if config.get("embed"):
        found.append(names["embed"])
    if config.get("head"):
        found.append(names["head"])
    return found


def supported(config: dict[str, Any]) -> str:
    """Why this peft cannot express the config ('' where it can): a LoraConfig field it does not have yet."""
    from peft import LoraConfig

    fields = set(getattr(LoraConfig, "__dataclass_fields__", {}))
    for axis, field in (("lora_bias", "lora_bias"), ("trainable_tokens", "trainable_token_indices"),
                        ("rslora", "use_rslora"), ("adapter", "use_dora")):  # fmt: skip
        wanted = config.get(axis) == "dora" if axis == "adapter" else bool(config.get(axis))
        if wanted and field not in fields:
            return f"this peft has no LoraConfig.{field}"
    return ""


def adapter_tensors(model: Any, adapter: str) -> dict[str, Any]:
    """The model's tensors of one adapter (a peft word followed by the adapter's name in the parameter's path)."""
    found = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts = name.split(".")
        if any(parts[i] in PEFT_WORDS and parts[i + 1] == adapter for i in range(len(parts) - 1)):
            found[name] = tensor
    return found


def build_and_train(config: dict[str, Any], batch: dict[str, Any]) -> Any:
    """The base model with every adapter of the config, each trained TRAIN_STEPS AdamW steps on `batch` and then
    moved by noise the loading process cannot regenerate."""
    import torch
    from peft import get_peft_model

    adapters = list(config.get("adapters", ["default"]))
    model = get_peft_model(named_models.build(config), lora_config(config, adapters[0]), adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, lora_config(config, name))
    for index, name in enumerate(adapters):
        model.set_adapter(name)
        own = adapter_tensors(model, name)
        for tensor in own.values():
            if tensor.is_floating_point():
                tensor.requires_grad_(True)
        optimizer = torch.optim.AdamW([t for t in own.values() if t.requires_grad], lr=LR)
        model.train()
        for _ in range(TRAIN_STEPS):
            logits = model(input_ids=batch["input_ids"]).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     batch["input_ids"][:, 1:].reshape(-1))  # fmt: skip
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        generator = torch.Generator().manual_seed(NOISE_SEED + index)
        with torch.no_grad():
            for tensor in own.values():
                if tensor.is_floating_point():
                    tensor.add_(0.02 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype))
    model.eval()
    return model


def scalings(model: Any, adapter: str) -> dict[str, float]:
    """module path (as the base model names it) -> the scaling the model uses for `adapter` there."""
    found = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and adapter in scaling:
            found[base_path(name)] = float(scaling[adapter])
    return found


def base_path(name: str) -> str:
    """A module's path in the base model, from its path in the PeftModel."""
    return name.removeprefix("base_model.model.")


def adapter_dir(root: str, adapter: str) -> str:
    """Where save_pretrained writes an adapter: the folder itself for "default", a subfolder named after it else."""
    return root if adapter == "default" else os.path.join(root, adapter)


def save(config: dict[str, Any], batch: dict[str, Any], root: str) -> dict[str, Any]:
    """Train, save (`save_pretrained` and the base weights), and keep what the saving model computes per adapter."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(root, exist_ok=True)
    save_file({k: v.contiguous() for k, v in named_models.build(config).state_dict().items()},
              os.path.join(root, "base.safetensors"))  # fmt: skip
    model = build_and_train(config, batch)
    logits, kept = {}, {}
    with torch.no_grad():
        for adapter in config.get("adapters", ["default"]):
            model.set_adapter(adapter)
            logits[adapter] = model(input_ids=batch["input_ids"]).logits.detach().clone()
            kept[adapter] = {"scalings": scalings(model, adapter),
                             "tensors": sorted(adapter_tensors(model, adapter))}  # fmt: skip
    model.save_pretrained(root)
    identities.tensors_to_file(logits, os.path.join(root, "saved-logits.pt"))
    trained = {f"{a}|{n}": t for a in config.get("adapters", ["default"]) for n, t in adapter_tensors(model, a).items()}
    identities.tensors_to_file(trained, os.path.join(root, "saved-tensors.pt"))
    with open(os.path.join(root, "roundtrip.json"), "w") as handle:
        json.dump({"config": config, "adapters": kept}, handle, indent=1)
    return kept


# --- the loading side (a fresh process) --------------------------------------------------------------------------


def load(payload: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: the base from its saved weights, then the adapters as the config's load path loads them
    (`from_pretrained`, then `load_adapter` for the others; or `load_adapter` into a model already holding another
    adapter); each adapter's logits, its tensors, the merged model's logits, and what the load said."""
    import logging
    import warnings

    import torch

    torch.manual_seed(LOAD_SEED)
    config, root, batch = payload["config"], payload["root"], identities.tensors_from_file(payload["batch"])
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage()[:300])

    handler = Keep(logging.WARNING)
    for name in ("peft", "transformers"):
        logging.getLogger(name).addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, results = _load_adapters(config, root)
    finally:  # one process may load many adapters (the grid): each load listens only to itself
        for name in ("peft", "transformers"):
            logging.getLogger(name).removeHandler(handler)
    said += [str(w.message)[:300] for w in caught if "adapter" in str(w.message).lower()
             or "key" in str(w.message).lower()]  # fmt: skip
    logits, tensors, merged, merge_error = {}, {}, {}, ""
    with torch.no_grad():
        model.eval()
        for adapter in config.get("adapters", ["default"]):
            model.set_adapter(adapter)
            logits[adapter] = model(input_ids=batch["input_ids"]).logits.detach().clone()
            for name, tensor in adapter_tensors(model, adapter).items():
                tensors[f"{adapter}|{name}"] = tensor.detach().clone()
        first = config.get("adapters", ["default"])[0]
        model.set_adapter(first)
        try:
            import copy

            merged_model = copy.deepcopy(model).merge_and_unload()
            merged[first] = merged_model(input_ids=batch["input_ids"]).logits.detach().clone()
        except Exception as exc:  # judged after the load legs (scenario: check-roundtrip-merge)
            merge_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        unmerged, unmerge_error = _merged_then_unmerged(model, batch["input_ids"], first)
    workdir = ctx["workdir"]
    os.makedirs(workdir, exist_ok=True)
    return {
        "logits": identities.tensors_to_file(logits, os.path.join(workdir, "loaded-logits.pt")),
        "tensors": identities.tensors_to_file(tensors, os.path.join(workdir, "loaded-tensors.pt")),
        "merged": identities.tensors_to_file(merged, os.path.join(workdir, "merged-logits.pt")),
        "unmerged": identities.tensors_to_file(unmerged, os.path.join(workdir, "unmerged-base-logits.pt")),
        "said": said[:20],
        "merge_error": merge_error,
        "unmerge_error": unmerge_error,
        "load_results": results,
    }


def _merged_then_unmerged(model: Any, input_ids: Any, adapter: str) -> tuple[dict[str, Any], str]:
    """A copy of the loaded model, `merge_adapter()` then `unmerge_adapter()`, its logits with the adapters disabled:
    what should be the base model again (the unmerge leg). Any error is the leg's outcome, said after the others."""
    import copy

    try:
        model = copy.deepcopy(model)
        model.merge_adapter()
        model.unmerge_adapter()
        with model.disable_adapter():
            return {adapter: model(input_ids=input_ids).logits.detach().clone()}, ""
    except Exception as exc:
        return {}, f"{type(exc).__name__}: {str(exc)[:300]}"


def _load_adapters(config: dict[str, Any], root: str) -> tuple[Any, dict[str, Any]]:
    from peft import PeftModel, get_peft_model
    from safetensors.torch import load_file

    base = named_models.build(config, seed=LOAD_SEED)
    base.load_state_dict(load_file(os.path.join(root, "base.safetensors")))
    adapters = list(config.get("adapters", ["default"]))
    results: dict[str, Any] = {}
    if config.get("load") == "load_adapter":
        from peft import LoraConfig

        names = named_models.names_of(config)
        model = get_peft_model(base, LoraConfig(r=2, target_modules=[names["o"]]), adapter_name="holder")
        pending = adapters
    else:
        model = PeftModel.from_pretrained(base, adapter_dir(root, adapters[0]), adapter_name=adapters[0])
        pending = adapters[1:]
    for adapter in pending:
        outcome = model.load_adapter(adapter_dir(root, adapter), adapter_name=adapter)
        results[adapter] = {
            "missing": [k for k in getattr(outcome, "missing_keys", []) or [] if adapter in k][:20],
            "unexpected": list(getattr(outcome, "unexpected_keys", []) or [])[:20],
        }
    return model, results


# --- the reference, from the saved files --------------------------------------------------------------------------

SUFFIXES = (
    (".lora_A.weight", "A"), (".lora_B.weight", "B"), (".lora_B.bias", "bias"),
    (".lora_embedding_A", "EA"), (".lora_embedding_B", "EB"),
    (".lora_magnitude_vector.weight", "m"), (".lora_magnitude_vector", "m"),
    (".token_adapter.trainable_tokens_delta", "tokens"),
)  # fmt: skip


def saved_parts(root: str, adapter: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[str]]:
    """The saved file of one adapter, read by hand: module path -> {A, B, bias, EA, EB, m, tokens, or the module's
    own weight/bias for `modules_to_save`}, the saved adapter_config.json, and the keys that name no known part."""
    from safetensors.torch import load_file

    folder = adapter_dir(root, adapter)
    tensors = load_file(os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json")) as handle:
        saved_config = json.load(handle)
    parts: dict[str, dict[str, Any]] = {}
    unknown = []
    for key, tensor in tensors.items():
        path = base_path(key)
        for suffix, part in SUFFIXES:
            if path.endswith(suffix):
                parts.setdefault(path[: -len(suffix)], {})[part] = tensor
                break
        else:
            module, _, leaf = path.rpartition(".")
            if leaf in ("weight", "bias"):
                parts.setdefault(module, {})[f"own_{leaf}"] = tensor
            else:
                unknown.append(key)
    return parts, saved_config, unknown


def formula_model(config: dict[str, Any], root: str, adapter: str, dtype: Any) -> tuple[Any, list[str]]:
    """The base (its saved weights) with the saved adapter applied by the formulas, in `dtype`; and the saved module
    paths the base model does not have (the file names modules that are not there)."""
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(root, "roundtrip.json")) as handle:
        kept = json.load(handle)["adapters"][adapter]
    model = named_models.build(config)
    model.load_state_dict(load_file(os.path.join(root, "base.safetensors")))
    model = model.to(dtype)
    modules = dict(model.named_modules())
    parts, saved_config, _ = saved_parts(root, adapter)
    nowhere = []
    with torch.no_grad():
        for path, part in parts.items():
            module = modules.get(path)
            if module is None or not isinstance(getattr(module, "weight", None), torch.Tensor):
                nowhere.append(path)  # the file names a module the model lacks, or one that holds no weight
                continue
            try:
                _apply(module, part, float(kept["scalings"].get(path, 0.0)), saved_config, path, dtype)
            except RuntimeError as exc:  # shapes that do not fit the module: the file's part is not this module's
                nowhere.append(f"{path} ({str(exc).splitlines()[0][:80]})")
    model.eval()
    return model, nowhere


def _apply(module: Any, part: dict[str, Any], s: float, saved_config: dict[str, Any], path: str, dtype: Any) -> None:
    """One module's saved parts applied by the formulas (see the module's docstring)."""
    import torch

    part = {k: v.to(dtype) for k, v in part.items()}
    if "own_weight" in part:  # modules_to_save: the saved module in place of the base's
        module.weight.copy_(part["own_weight"])
        if "own_bias" in part and module.bias is not None:
            module.bias.copy_(part["own_bias"])
    if "A" in part and "B" in part:
        combined = module.weight + s * (part["B"] @ part["A"])
        if "m" in part:
            norm = combined.norm(p=2, dim=1, keepdim=True)
            combined = part["m"].reshape(-1, 1) * combined / norm
        module.weight.copy_(combined)
    if "bias" in part:
        if module.bias is None:
            module.bias = torch.nn.Parameter(torch.zeros(module.weight.shape[0], dtype=dtype))
        module.bias.add_(s * part["bias"])
    if "EA" in part and "EB" in part:
        module.weight.add_(s * (part["EB"] @ part["EA"]).T)
    if "tokens" in part:
        indices = _token_indices(saved_config, path)
        module.weight[indices] = part["tokens"]


def _token_indices(saved_config: dict[str, Any], path: str) -> list[int]:
    indices = saved_config.get("trainable_token_indices")
    if isinstance(indices, dict):
        for name, values in indices.items():
            if path == name or path.endswith(f".{name}"):
                return list(values)
        return list(next(iter(indices.values())))
    return list(indices or [])


# --- the keys --------------------------------------------------------------------------------------------------------


def key_report(root: str, adapter: str, loaded: dict[str, Any]) -> dict[str, list[str]]:
    """Every tensor followed by its values (each is unique: the noise): `not_saved` (the saving model's tensor of this
    adapter that its file does not hold), `foreign` (a file key holding another adapter's tensor, or nothing the
    saving model had), `dropped` (a file key of this adapter that no loaded tensor of it holds), `moved` (held by
    another module's tensor than the one it was saved from), `not_from_file` (a loaded tensor of this adapter at
    values the file does not hold: it kept its fresh init)."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(os.path.join(adapter_dir(root, adapter), "adapter_model.safetensors"))
    trained = identities.tensors_from_file(os.path.join(root, "saved-tensors.pt"))

    def holders(tensor: Any, pool: dict[str, Any]) -> list[str]:
        return [n for n, t in pool.items() if t.shape == tensor.shape and torch.equal(t.to(tensor.dtype), tensor)]

    own = {n.split("|", 1)[1]: t for n, t in trained.items() if n.split("|", 1)[0] == adapter}
    mine = {n.split("|", 1)[1]: t for n, t in loaded.items() if n.split("|", 1)[0] == adapter}
    not_saved = sorted(n for n, t in own.items() if not holders(t, saved))
    foreign, dropped, moved, matched = [], [], [], set()
    for key, tensor in saved.items():
        origin = holders(tensor, trained)
        if not any(o.split("|", 1)[0] == adapter for o in origin):
            foreign.append(f"{key} ({'holds ' + origin[0].replace('|', ': ') if origin else 'nothing trained'})")
            continue
        found = holders(tensor, mine)
        if not found:
            dropped.append(key)
            continue
        matched.update(found)
        if not any(_module_of(base_path(h)) == _module_of(base_path(key)) for h in found):
            moved.append(f"{key} -> {found[0]}")
    not_from_file = sorted(n for n in mine if n not in matched)
    return {"not_saved": not_saved, "foreign": sorted(foreign), "dropped": sorted(dropped), "moved": sorted(moved),
            "not_from_file": not_from_file}  # fmt: skip


def _module_of(path: str) -> str:
    """The model module a saved or loaded adapter tensor belongs to: its path up to the first peft word."""
    parts = path.split(".")
    for index, part in enumerate(parts):
        if part in (*PEFT_WORDS, "token_adapter", "base_layer"):
            return ".".join(parts[:index])
    return ".".join(parts[:-1])
