# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.13.0", "transformers==5.24.0", "peft==0.21.0", "accelerate==1.15.0", "safetensors"]
# ///
"""accelerate's FSDP1 recipe for saving a PEFT adapter writes an empty adapter with peft 0.21.0.

The recipe (accelerate's FSDP docs, and what `Accelerator.get_state_dict` does): gather a FULL_STATE_DICT on every
rank, then `peft_model.save_pretrained(dir, state_dict=sd, is_main_process=rank == 0)`. A tiny Llama (built from a
config, no download), LoRA on q_proj/v_proj, FSDP1 with peft's wrap policy, 2 ranks on CPU (gloo), three steps.
Exit 1 with one line when the saved adapter is empty or untrained, 0 when it holds the trained LoRA tensors.
Run: `uv run repro.py`.
"""

import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train_and_save(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(LlamaForCausalLM(config), lora)
    wrapped = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=torch.device("cpu"))
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(rank))
    for _ in range(3):
        wrapped(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with FSDP.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)):
        state = wrapped.state_dict()
    model.save_pretrained(out, state_dict=state, is_main_process=rank == 0)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    out = tempfile.mkdtemp()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(train_and_save, args=(2, port, out), nprocs=2)
    from safetensors.torch import load_file

    path = os.path.join(out, "adapter_model.safetensors")
    tensors = load_file(path)
    trained = [name for name, value in tensors.items() if "lora_B" in name and value.abs().sum() > 0]
    if not tensors:
        print(f"FAIL: the saved adapter is empty: {os.path.getsize(path)} bytes, no tensor (8 LoRA tensors trained)")
        return 1
    if len(trained) < 4:
        print(f"FAIL: the saved adapter is untrained: {len(trained)} of 4 lora_B tensors differ from zero")
        return 1
    size = os.path.getsize(path)
    print(f"ok: the saved adapter holds {len(tensors)} tensors, {len(trained)} trained lora_B ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
