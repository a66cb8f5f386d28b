"""LoRA trained with the HF Trainer under FSDP (FULL_STATE_DICT) on 2 GPUs, saved with `trainer.save_model()`:
is the saved adapter the trained one? Users report adapters saved under sharded training that hold nothing
(huggingface/peft#2892, huggingface/trl#4416: 'SFTTrainer creates empty adapter.safetensors file while saving';
huggingface/transformers#30491 for SHARDED_STATE_DICT). Here the state dict type is FULL_STATE_DICT, as
`accelerate launch --fsdp_state_dict_type FULL_STATE_DICT` exports it and as the Trainer's fsdp_config says it.

Run with `torchrun --nproc-per-node 2`. A tiny Llama (built from a config, no hub), LoRA on q_proj/v_proj, three
steps at a learning rate that moves lora_B away from its zero start, then every rank calls save_model and rank 0
reads the file back: it fails if the adapter holds no tensors or if every lora_B is still zero (untrained).
On CPU the Trainer ignores `fsdp=` and trains with DDP, so without 2 GPUs this exits 77 (not applicable).
"""

import os
import sys
import tempfile

import torch

world = int(os.environ.get("WORLD_SIZE", "1"))
if not torch.cuda.is_available() or torch.cuda.device_count() < world or world < 2:
    sys.exit(77)

from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=64,
)  # fmt: skip
model = get_peft_model(
    LlamaForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
)


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


where = os.path.join(tempfile.gettempdir(), f"fsdp-lora-save-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
os.environ["FSDP_STATE_DICT_TYPE"] = "FULL_STATE_DICT"
args = TrainingArguments(
    output_dir=os.path.join(where, "trainer"), per_device_train_batch_size=2, max_steps=3, learning_rate=1e-2,
    report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
    fsdp="full_shard auto_wrap",
    fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "state_dict_type": "FULL_STATE_DICT"},
)  # fmt: skip
trainer = Trainer(model=model, args=args, train_dataset=Rows())
trainer.train()
trainer.save_model(os.path.join(where, "adapter"))
if rank == 0:
    path = os.path.join(where, "adapter", "adapter_model.safetensors")
    tensors = load_file(path)
    if not tensors:
        raise RuntimeError(f"the saved adapter is empty: {os.path.getsize(path)} bytes, no tensors")
    trained = [k for k, v in tensors.items() if "lora_B" in k and v.abs().sum() > 0]
    if not trained:
        raise RuntimeError(f"the saved adapter is untrained: every lora_B of {len(tensors)} tensors is zero")
    print(f"saved adapter: {len(tensors)} tensors, {len(trained)} trained lora_B")
