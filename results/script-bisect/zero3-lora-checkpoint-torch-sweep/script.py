# /// script
# dependencies = ["torch", "transformers", "peft", "accelerate", "deepspeed"]
# ///
"""LoRA under DeepSpeed ZeRO-3 with non-reentrant gradient checkpointing, as an OpenRLHF user trains.

Upstream report: https://github.com/OpenRLHF/OpenRLHF/issues/569 ("CheckpointError: torch.utils.checkpoint:
Recomputed values for the following tensors have different metadata than during the forward pass ...
recomputed metadata: {'shape': torch.Size([0]) ..."), explained in
https://github.com/huggingface/transformers/issues/47254. A tiny Llama built from its config (no hub), LoRA on
every linear layer, ZeRO-3 in bf16, `gradient_checkpointing_enable(use_reentrant=False)`, three steps of
`deepspeed.initialize` + a hand loop; launched under torchrun with two ranks (gloo on CPU). Exit 0 when the
three steps finish.
"""

import deepspeed
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64, torch_dtype="bfloat16",
)
ds_config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": True},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model = get_peft_model(
    model,
    LoraConfig(
        r=32, lora_alpha=16, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
for step in range(3):
    ids = (torch.arange(32).reshape(2, 16) * (step + 1) + dist.get_rank()) % 128
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    print(f"rank {dist.get_rank()} step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
