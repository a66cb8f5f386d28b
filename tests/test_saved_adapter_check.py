"""S7's check can fail: a saved adapter that is empty, truncated to no tensor, or holds the initial weights is told
from the trained one, and the trained one passes (real peft and transformers, in the CI cell's environment)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import found_in_ci_env

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from safetensors.torch import load_file, save_file
    from scenarios.compat import CheckFailed
    from scenarios.kit import saving

    work = sys.argv[1]
    torch.manual_seed(0)
    base_dir = os.path.join(work, "base")
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4)).save_pretrained(base_dir)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    initial = saving.adapter_part(model.state_dict())
    initial_dir = os.path.join(work, "initial")
    model.save_pretrained(initial_dir)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.05)  # "training"
    trained = saving.adapter_part(model.state_dict())
    ids = torch.randint(0, 128, (2, 16))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    reference = os.path.join(work, "reference.pt")
    saving.write_reference(reference, trained, initial, logits, ids)
    good = os.path.join(work, "good")
    model.save_pretrained(good)
    empty = os.path.join(work, "empty")
    model.save_pretrained(empty)
    save_file({}, os.path.join(empty, "adapter_model.safetensors"))
    half = os.path.join(work, "half")
    model.save_pretrained(half)
    tensors = load_file(os.path.join(half, "adapter_model.safetensors"))
    save_file(dict(list(tensors.items())[: len(tensors) // 2]), os.path.join(half, "adapter_model.safetensors"))
    found = {}
    for name, directory in (("good", good), ("empty", empty), ("half", half), ("initial", initial_dir)):
        try:
            saving.compare_saved(base_dir, directory, reference)
            found[name] = "pass"
        except CheckFailed as exc:
            found[name] = exc.check
    print("FOUND " + json.dumps(found))
    """
)


@pytest.mark.matrix
def test_the_saved_adapter_check_can_fail(tmp_path: Path) -> None:
    assert found_in_ci_env(SCRIPT, tmp_path, str(tmp_path)) == {
        "good": "pass",
        "empty": "saved_adapter_empty",
        "half": "saved_adapter_untrained",
        "initial": "saved_adapter_untrained",
    }
