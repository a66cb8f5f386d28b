# /// script
# dependencies = ["torch", "transformers", "peft", "accelerate"]
# ///
"""A LoRA with `lora_bias=True` (and lora_alpha twice r) on a tiny Llama with biases: `merge_and_unload()` must give
the adapter model's logits. Exit with a message where the merged model differs; 0 where it agrees.

The shape of a user's own check, with peft's `lora_bias` (added in peft 0.14.0: older releases refuse the keyword). On
CPU machines whose libstdc++ is older than a bitsandbytes build needs, importing peft prints a traceback that
bitsandbytes caught (its CPU library cannot load) and goes on: that is not the script's failure.
"""

import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, attention_bias=True, mlp_bias=True)  # fmt: skip
model = LlamaForCausalLM(config)
lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_bias=True, init_lora_weights=False)
model = get_peft_model(model, lora)
with torch.no_grad():  # the adapter's bias as a trained one would be: not zero
    for name, param in model.named_parameters():
        if "lora_B" in name and name.endswith("bias"):
            param.normal_(0, 0.5)
model.eval()
ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    expected = model(input_ids=ids).logits
    merged = model.merge_and_unload()(input_ids=ids).logits
difference = float((merged - expected).abs().max())
if difference > 1e-4:
    sys.exit(f"merged model differs from the adapter model: max abs logits difference {difference:.3g}")
print(f"merged model agrees (max abs logits difference {difference:.2g})")
