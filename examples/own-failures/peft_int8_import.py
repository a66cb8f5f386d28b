# /// script
# dependencies = ["torch", "transformers", "peft"]
# ///
"""A LoRA fine-tuning script written for peft <= 0.9, run on a newer stack.

Upstream report: https://github.com/huggingface/peft/issues/1583
("cannot import name 'prepare_model_for_int8_training' from 'peft'"). A tiny Llama built from its config
(no hub), prepared the way the report's script does, one LoRA training step on CPU; exit 0 when the adapters
learn.
"""

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_int8_training
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)
model = prepare_model_for_int8_training(LlamaForCausalLM(config))
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
ids = torch.randint(0, 64, (2, 16))
before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
optimizer.step()
changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
assert changed, "no adapter weight changed"
print(f"loss {loss.item():.4f}, {len(changed)} adapter tensors updated")
