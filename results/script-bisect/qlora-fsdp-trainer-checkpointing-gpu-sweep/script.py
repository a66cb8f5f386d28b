"""QLoRA + FSDP through the HF Trainer on 2 GPUs with gradient checkpointing, as huggingface/peft#1577 reports it
(peft's FSDP-QLoRA example on 2 x A100: 'RuntimeError: element 0 of tensors does not require grad and does not
have a grad_fn'); the peft docs' recipe for FSDP + QLoRA: bnb_4bit_quant_storage equal to the model dtype,
`fsdp="full_shard auto_wrap"`, use_orig_params off.

Run with `torchrun --nproc-per-node 2`. Each rank loads a tiny Llama (built from a config and saved once, no hub) in
4 bits onto its own GPU, wraps it with LoRA (q_proj, v_proj), and the Trainer turns checkpointing on
(`gradient_checkpointing=True`, the release's defaults) and trains three steps under FSDP.
The 4-bit path and FSDP over NCCL need 2 GPUs: exit 77 (not applicable) without them.
"""

import os
import sys
import tempfile
from importlib.metadata import version

import torch

world = int(os.environ.get("WORLD_SIZE", "1"))
if not torch.cuda.is_available() or torch.cuda.device_count() < world or world < 2:
    sys.exit(77)

import torch.distributed as dist  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import (  # noqa: E402
    BitsAndBytesConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
where = os.path.join(tempfile.gettempdir(), f"qlora-fsdp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
args = TrainingArguments(
    output_dir=os.path.join(where, "trainer"), per_device_train_batch_size=2, max_steps=3, learning_rate=1e-3,
    report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, bf16=True,
    gradient_checkpointing=True,
    fsdp="full_shard auto_wrap",
    fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "use_orig_params": False},
)  # fmt: skip
if rank == 0:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(os.path.join(where, "base"))
dist.barrier()  # (the TrainingArguments above started the process group)
major, minor = (int(x) for x in version("transformers").split(".")[:2])
dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
quantized = BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
    bnb_4bit_quant_storage=torch.bfloat16,
)  # fmt: skip
model = LlamaForCausalLM.from_pretrained(
    os.path.join(where, "base"), quantization_config=quantized, device_map={"": local_rank},
    **{dtype_key: torch.bfloat16},
)  # fmt: skip
lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
model = get_peft_model(model, lora)


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


trainer = Trainer(model=model, args=args, train_dataset=Rows())
trainer.train()
losses = [round(e["loss"], 4) for e in trainer.state.log_history if "loss" in e]
if rank == 0:
    print(f"trained under FSDP: losses {losses}")
