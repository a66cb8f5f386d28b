# /// script
# dependencies = ["torch", "transformers==4.39.3", "peft==0.10.0", "accelerate"]
# ///
"""A project that pinned transformers 4.39.3 and peft 0.10.0 (the stack of the report) and let the rest float.

Upstream report: https://github.com/huggingface/transformers/issues/34699
("TypeError: Accelerator.__init__() got an unexpected keyword argument 'dispatch_batches'"; duplicate:
https://github.com/huggingface/transformers/issues/34714). LoRA on a tiny Llama built from its config, one HF
Trainer step on CPU; exit 0 when training finishes.
"""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        ids = torch.arange(index, index + 16) % 64
        return {"input_ids": ids, "labels": ids.clone()}


torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)
model = get_peft_model(
    LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
)
args = TrainingArguments(
    output_dir="out", max_steps=1, per_device_train_batch_size=2, use_cpu=True, report_to=[], save_strategy="no"
)
Trainer(model=model, args=args, train_dataset=Rows()).train()
