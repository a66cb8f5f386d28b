# /// script
# dependencies = ["torch", "transformers", "peft", "accelerate", "bitsandbytes"]
# ///
"""The FSDP-QLoRA recipe users copy (peft docs, accelerate/fsdp.md; the S2-FSDP path through HF Trainer): a 4-bit
base with bnb_4bit_quant_storage = the compute dtype, LoRA on all linear layers, TrainingArguments with
fsdp="full_shard auto_wrap" and fsdp_config {use_orig_params: False, cpu_ram_efficient_loading: True,
sync_module_states: True}, reentrant gradient checkpointing, bf16. Start it with torchrun (2 ranks).

It says what really ran: the number of Linear4bit modules after loading, and the wrapper the Trainer put around
the model when training begins. Where that wrapper is not FSDP (accelerate applies no FSDP without an
accelerator), it exits 77, "not applicable": the run then says nothing about FSDP. A tiny Llama from its config,
two optimizer steps; exit 0 when both steps ran under FSDP.
"""

import os
import sys
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

rank = int(os.environ.get("RANK", "0"))
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)
path = tempfile.mkdtemp(prefix=f"tiny-{rank}-")
LlamaForCausalLM(config).save_pretrained(path)
dtype = torch.bfloat16
bnb = BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True,
    bnb_4bit_quant_storage=dtype,
)
model = LlamaForCausalLM.from_pretrained(path, quantization_config=bnb, torch_dtype=dtype)
linear4bit = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
print(f"RAN rank={rank} linear4bit={linear4bit}", flush=True)
if not linear4bit:
    print("not applicable: no Linear4bit module after loading (this stack cannot quantize here)", file=sys.stderr)
    sys.exit(77)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        ids = torch.arange(index, index + 16) % 128
        return {"input_ids": ids, "labels": ids.clone()}


class SayWhatWrapped(TrainerCallback):
    """When training begins, the model is wrapped: FSDP, or something else (then this run is no FSDP evidence)."""

    def on_train_begin(self, args, state, control, **kwargs):
        wrapper = type(trainer.model_wrapped).__name__
        print(f"RAN rank={rank} wrapper={wrapper}", flush=True)
        if "FullyShardedDataParallel" not in wrapper and not wrapper.startswith("FSDP"):
            print(f"not applicable: fsdp was declared, {wrapper} wraps the model", file=sys.stderr, flush=True)
            os._exit(77)


args = TrainingArguments(
    output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=1, report_to=[], save_strategy="no",
    logging_steps=1, bf16=True, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True},
    fsdp="full_shard auto_wrap",
    fsdp_config={
        "backward_prefetch": "backward_pre", "forward_prefetch": False, "use_orig_params": False,
        "cpu_ram_efficient_loading": True, "sync_module_states": True,
    },
    **({"use_cpu": True, "ddp_backend": "gloo"} if not torch.cuda.is_available() else {}),
)
trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[SayWhatWrapped()])
trainer.train()
print(f"RAN rank={rank} steps={trainer.state.global_step}", flush=True)
