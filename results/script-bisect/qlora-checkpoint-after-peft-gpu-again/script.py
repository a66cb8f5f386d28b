"""QLoRA with gradient checkpointing turned on after get_peft_model, as huggingface/transformers#42489 and
huggingface/peft#1577 report it: 'RuntimeError: element 0 of tensors does not require grad and does not have a
grad_fn' at loss.backward().

A tiny Llama (built from a config, no hub) saved and loaded in 4 bits with bitsandbytes (nf4, bf16 compute and
storage), LoRA on q_proj/v_proj, then `model.gradient_checkpointing_enable()` on the PEFT model with the release's
defaults (the order `Trainer(gradient_checkpointing=True)` produces: the model is wrapped first), three steps.
The 4-bit path needs CUDA: exit 77 (not applicable) without a GPU.
"""

import sys
import tempfile
from importlib.metadata import version

import torch

if not torch.cuda.is_available():
    sys.exit(77)

from peft import LoraConfig, get_peft_model
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)  # fmt: skip
major, minor = (int(x) for x in version("transformers").split(".")[:2])
dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
quantized = BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
    bnb_4bit_quant_storage=torch.bfloat16,
)  # fmt: skip
with tempfile.TemporaryDirectory() as directory:
    LlamaForCausalLM(config).save_pretrained(directory)
    model = LlamaForCausalLM.from_pretrained(
        directory, quantization_config=quantized, device_map={"": 0}, **{dtype_key: torch.bfloat16}
    )
lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
model = get_peft_model(model, lora)
model.gradient_checkpointing_enable()
model.train()
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
ids = torch.randint(0, 128, (2, 16), device="cuda")
for step in range(3):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {loss.item():.4f}")
