"""Saving a trained adapter the ways users do under FSDP and ZeRO-3, and checking that what was saved is what was
trained: reloaded from disk in a fresh process, outside any distributed wrapper, and compared tensor by tensor and
output by output with the trained model.

The trained reference is gathered by the scenario itself (FSDP1's FULL_STATE_DICT, FSDP2's full tensors, ZeRO-3's
GatheredParameters), whatever the saving path under test does; the logits of the trained model on a fixed batch are
taken under the distributed wrapper (every rank runs that forward). The check names a failure by what the user
sees when they load the file.
"""

from __future__ import annotations

import json
import os
from typing import Any

from scenarios.compat import CheckFailed

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def clean_key(name: str) -> str:
    """A parameter name as peft saves it: no wrapper parts, no adapter name."""
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(junk, "")
    return name.replace(".default.", ".").replace(".default", "")


def adapter_part(state: dict[str, Any]) -> dict[str, Any]:
    """The adapter's tensors of a full state dict (LoRA/DoRA weights and modules_to_save copies), by clean key."""
    keep = ("lora_", "modules_to_save")
    return {clean_key(k): v.detach().float().cpu().clone() for k, v in state.items() if any(p in k for p in keep)}


def save_by_key(state: dict[str, Any], peft_model: Any, directory: str) -> None:
    """The workaround users post: the adapter's tensors picked from a full state dict by name, written with
    safetensors beside the adapter config (what peft's own save did by key before it asked the modules)."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for key, value in state.items():
        if "lora_" in key or "modules_to_save" in key:
            # peft's own names: no adapter name, and a module saved whole under the name of the module it replaces
            name = key.replace("_fsdp_wrapped_module.", "").replace(".modules_to_save.default.", ".")
            name = name.replace(".default.", ".").replace(".default", "")
            tensors[name] = value.detach().contiguous().cpu()
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_model.peft_config["default"].save_pretrained(directory)


def write_reference(path: str, trained: dict[str, Any], initial: dict[str, Any], logits: Any, ids: Any) -> None:
    """The trained and initial adapter tensors and the trained model's logits, for the reload check."""
    import torch

    torch.save({"trained": trained, "initial": initial, "logits": logits.float().cpu(), "ids": ids.cpu()}, path)


def reload_check(base_dir: str, adapter_dir: str, reference: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """Reload the adapter from disk in a fresh process (spawned: no process group, no wrapper, nothing of the
    training process) and compare; returns the facts, raises CheckFailed with what the user would see."""
    import multiprocessing

    result_path = reference + ".result.json"
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_reload_in_child, args=(base_dir, adapter_dir, reference, result_path))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        raise CheckFailed("saved_adapter_load_error", f"reloading the adapter did not finish in {timeout_s:.0f} s")
    if not os.path.isfile(result_path):
        raise CheckFailed("saved_adapter_load_error", f"the reloading process died (exit {child.exitcode})")
    with open(result_path) as handle:
        facts = json.load(handle)
    if facts.get("failed"):
        raise CheckFailed(facts["failed"], facts["detail"], metrics=facts)
    return facts


def _reload_in_child(base_dir: str, adapter_dir: str, reference: str, result_path: str) -> None:
    try:
        facts = compare_saved(base_dir, adapter_dir, reference)
    except CheckFailed as exc:
        facts = {"failed": exc.check, "detail": str(exc).split(": ", 1)[-1]} | exc.metrics
    except Exception as exc:  # a load that raises is what the user sees: named, with the exception
        facts = {"failed": "saved_adapter_load_error", "detail": f"{type(exc).__name__}: {str(exc)[:500]}"}
    with open(result_path, "w") as handle:
        json.dump(facts, handle)


def compare_saved(base_dir: str, adapter_dir: str, reference: str) -> dict[str, Any]:
    """What a user's reload gives: the file's tensors, then PeftModel.from_pretrained on a fresh base, its adapter
    compared with the trained reference (by the same names on both sides) and its logits on the fixed batch."""
    import torch

    ref = torch.load(reference, weights_only=False)
    trained = ref["trained"]
    found = [name for name in ADAPTER_FILES if os.path.isfile(os.path.join(adapter_dir, name))]
    if not found:
        raise CheckFailed("saved_adapter_load_error", f"no adapter file in {sorted(os.listdir(adapter_dir))}")
    path = os.path.join(adapter_dir, found[0])
    saved = _read_tensors(path)
    facts: dict[str, Any] = {"file": found[0], "file_bytes": os.path.getsize(path), "saved_tensors": len(saved)}
    facts["trained_tensors"] = len(trained)
    if not saved:
        raise CheckFailed("saved_adapter_empty", f"{found[0]} holds no tensor ({facts['file_bytes']} bytes)", facts)
    empty = sorted(k for k, v in saved.items() if v.numel() == 0)
    if empty:
        facts["zero_size"] = len(empty)
        said = f"{len(empty)} of {len(saved)} saved tensors have no elements, e.g. {empty[0]}"
        raise CheckFailed("saved_adapter_zero_size", said, facts)
    reloaded, untouched, logits = _reload(base_dir, adapter_dir, ref["ids"])
    differs = sorted(k for k in trained if k not in reloaded or not torch.allclose(reloaded[k], trained[k], atol=1e-6))
    facts["values_differ"] = len(differs)
    if differs:
        # A tensor the file did not carry (or carried untrained) keeps the value a fresh adapter starts with.
        kept = [k for k in differs if k in reloaded and k in untouched and torch.equal(reloaded[k], untouched[k])]
        if kept:
            said = f"{len(kept)} of {len(trained)} adapter tensors reload with their initial values, e.g. {kept[0]}"
            raise CheckFailed("saved_adapter_untrained", said, facts)
        # How far (an intermittent difference in one tensor, seen under ZeRO-3, is still unexplained: the size says
        # whether it is stale data or rounding).
        deltas = [float((reloaded[k].float() - trained[k].float()).abs().max()) for k in differs if k in reloaded]
        facts["values_max_abs_delta"] = max(deltas, default=None)
        # Which side holds values no training makes (stale memory): the file, or the gathered trained reference.
        facts["differing_max_abs"] = {
            k: {"saved": float(reloaded[k].float().abs().max()), "trained": float(trained[k].float().abs().max())}
            for k in differs[:3]
            if k in reloaded
        }
        said = (
            f"{len(differs)} of {len(trained)} reloaded adapter tensors differ from the trained ones, e.g. {differs[0]}"
            + (f" (by up to {max(deltas):.3g})" if deltas else "")
        )
        raise CheckFailed("saved_adapter_values_differ", said, facts)
    delta = float((logits - ref["logits"]).abs().max())
    facts["reloaded_logits_max_abs_delta"] = delta
    if delta > 1e-4:
        raise CheckFailed("saved_adapter_outputs_differ", f"the reloaded model's logits differ by {delta:.3g}", facts)
    return facts


def _read_tensors(path: str) -> dict[str, Any]:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _reload(base_dir: str, adapter_dir: str, ids: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the reloaded adapter, the same adapter as a fresh one starts before any load, the reloaded logits):
    PeftModel.from_pretrained on a fresh base from disk, the user's reload; both built from one seed."""
    import torch
    from peft import PeftConfig, PeftModel, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(base_dir), adapter_dir)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    torch.manual_seed(0)
    fresh = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir), PeftConfig.from_pretrained(adapter_dir))
    return adapter_part(model.state_dict()), adapter_part(fresh.state_dict()), logits
