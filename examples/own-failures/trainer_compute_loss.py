# /// script
# dependencies = ["torch", "transformers", "peft", "accelerate"]
# ///
"""A custom Trainer that overrides compute_loss with the signature the docs showed up to transformers 4.45.

Upstream report: https://github.com/huggingface/transformers/issues/36331
("TypeError: CustomTrainer.compute_loss() got an unexpected keyword argument 'num_items_in_batch'"; the
boundary is discussed in https://github.com/huggingface/transformers/issues/35838). LoRA on a tiny Llama built
from its config, two optimizer steps with the HF Trainer on CPU, launched under torchrun with two ranks (gloo)
as a DDP user would; exit 0 when training finishes.
"""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        ids = torch.arange(index, index + 16) % 64
        return {"input_ids": ids, "labels": ids.clone()}


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False):  # the pre-4.46 signature
        outputs = model(**inputs)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)
model = get_peft_model(
    LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
)
args = TrainingArguments(
    output_dir="out", max_steps=2, per_device_train_batch_size=2, use_cpu=True, report_to=[], save_strategy="no",
    ddp_backend="gloo", logging_steps=1,
)
WeightedTrainer(model=model, args=args, train_dataset=Rows()).train()
