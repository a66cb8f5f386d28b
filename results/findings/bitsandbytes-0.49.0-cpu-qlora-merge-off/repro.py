# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0", "transformers==5.24.0", "peft==0.21.2", "accelerate==1.15.0", "bitsandbytes==0.49.0"]
# ///
"""A QLoRA adapter trained on CPU and merged with `merge_and_unload()` gives a model that computes something else
(bitsandbytes 0.49.0): its logits are off by most of the adapter's effect, not by the requantization a 4-bit merge
costs by design.

A tiny Llama (built from a config, no download) saved and loaded in 4-bit (NF4, float32 compute) on CPU, LoRA on
q_proj/v_proj, three AdamW steps, then `merge_and_unload()`. The right merge is computed by hand: each 4-bit weight
dequantized before any forward, plus the LoRA delta, quantized again by bitsandbytes with the weight's own settings,
in a float64 model. From 0.49.0 the first forward on CPU repacks 4-bit weights in place for the CPU kernels, and
peft's merge dequantizes the packed data. Exit 1 with one line when the merged model is off the right merge by more
than a tenth of the adapter's effect, 0 when it agrees. Run: `uv run repro.py`.
"""

import copy
import sys
import tempfile

import bitsandbytes as bnb
import torch
from peft import LoraConfig, get_peft_model
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
torch.manual_seed(0)
saved = LlamaForCausalLM(config)
folder = tempfile.mkdtemp()
saved.save_pretrained(folder)
quantized = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
model = LlamaForCausalLM.from_pretrained(folder, quantization_config=quantized, dtype=torch.float32)


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    return bnb.functional.dequantize_4bit(weight.data, weight.quant_state).double()


# Each 4-bit weight as the forward uses it, read before any forward.
base = {f"{n}.weight": dequantized(m.weight) for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
torch.manual_seed(1)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(3))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
for _ in range(3):
    optimizer.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
model.eval()

exact, right = dict(base), dict(base)
for name, layer in model.named_modules():
    if hasattr(layer, "lora_A") and "default" in layer.lora_A:
        key = name.removeprefix("base_model.model.") + ".weight"
        delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]).detach()
        exact[key] = base[key] + delta.double()
        weight = layer.base_layer.weight
        settings = {k: getattr(weight, k) for k in ("blocksize", "compress_statistics", "quant_type", "quant_storage")}
        again = bnb.nn.Params4bit(base[key].float() + delta, requires_grad=False, **settings).to("cpu")
        right[key] = dequantized(again)


def float64_logits(weights: dict) -> torch.Tensor:
    reference = LlamaForCausalLM(config).double().eval()
    state = {k: v.double() for k, v in saved.state_dict().items()} | weights
    reference.load_state_dict(state)
    with torch.no_grad():
        return reference(input_ids=ids).logits


with torch.no_grad():
    merged = copy.deepcopy(model).merge_and_unload()(input_ids=ids).logits.double()
effect = float((float64_logits(exact) - float64_logits(base)).abs().max())
off = float((merged - float64_logits(right)).abs().max()) / effect
by_design = float((float64_logits(right) - float64_logits(exact)).abs().max()) / effect
if off > 0.1:
    print(f"FAIL: the merged 4-bit model is {off:.3g}x the adapter's effect off the right merge "
          f"(requantization alone: {by_design:.3g}x)")  # fmt: skip
    sys.exit(1)
print(f"ok: the merged 4-bit model is {off:.3g}x the adapter's effect off the right merge "
      f"(requantization alone: {by_design:.3g}x)")  # fmt: skip
