"""Hand reproduction of the Trainer QLoRA + FSDP hang at world size 2 (issue 34). Knobs via REPRO env (comma list):
init=trainer|nccl|nccl_devid|gloo_nccl|setdev_nccl, quant=4bit|none, fsdp=fsdp|none, avg=1|0, dora=0|1, ds=list|dataset
"""
import os, sys, tempfile, time
knobs = dict(kv.split("=") for kv in os.environ.get("REPRO", "").split(",") if kv)
init = knobs.get("init", "nccl")
def say(text):
    print(text, file=sys.stderr, flush=True)
import torch
import torch.distributed as dist
rank = int(os.environ.get("RANK", "0")); local = int(os.environ.get("LOCAL_RANK", "0"))
if init == "nccl":
    dist.init_process_group("nccl")
elif init == "setdev_nccl":
    torch.cuda.set_device(local); dist.init_process_group("nccl")
elif init == "nccl_devid":
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
elif init == "gloo_nccl":
    torch.cuda.set_device(local); dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local))
say(f"REPRO rank={rank} init={init} knobs={knobs} pg={dist.is_initialized()} backend={dist.get_backend() if dist.is_initialized() else None}")
from peft import LoraConfig, get_peft_model
from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
def build_args():
    fs = knobs.get("fsdp", "fsdp")
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=1, report_to=[],
        save_strategy="no", logging_steps=1, bf16=torch.cuda.is_available(), gradient_checkpointing=True,
        average_tokens_across_devices=knobs.get("avg", "1") == "1",
        **({"fsdp": "full_shard auto_wrap", "fsdp_config": {"use_orig_params": False, "cpu_ram_efficient_loading": knobs.get("eff", "1") == "1",
            "sync_module_states": knobs.get("sync", "1") == "1"}} if fs == "fsdp" else {}))
    return args
order = knobs.get("order", "model_first")
if order == "args_first":
    args = build_args()
    say(f"REPRO rank={rank} args first; pg={dist.is_initialized()} env_fsdp={os.environ.get('ACCELERATE_USE_FSDP')} eff={os.environ.get('FSDP_CPU_RAM_EFFICIENT_LOADING')}")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=64)
if dist.is_initialized():  # transformers 5 writes on rank 0 only when a process group is up: share one dir
    path = f"/tmp/tiny-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}"
    if rank == 0:
        LlamaForCausalLM(cfg).save_pretrained(path)
    dist.barrier()
else:
    path = tempfile.mkdtemp(prefix=f"tiny-{rank}-")
    LlamaForCausalLM(cfg).save_pretrained(path)
dtype = torch.bfloat16
kw = {}
if knobs.get("quant", "4bit") == "4bit":
    kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                                                   bnb_4bit_use_double_quant=True, bnb_4bit_quant_storage=dtype)
if knobs.get("dm") == "local":
    kw["device_map"] = {"": local}
model = LlamaForCausalLM.from_pretrained(path, dtype=dtype, **kw)
say(f"REPRO rank={rank} loaded linear4bit={sum(type(m).__name__=='Linear4bit' for m in model.modules())} dev={next(model.parameters()).device}")
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM", use_dora=knobs.get("dora")=="1"))
rows = [{"input_ids": [(i + j) % 128 for j in range(16)], "labels": [(i + j) % 128 for j in range(16)]} for i in range(16)]
if knobs.get("ds", "list") == "dataset":
    class Rows(torch.utils.data.Dataset):
        def __len__(self): return len(rows)
        def __getitem__(self, i): return {k: torch.tensor(v) for k, v in rows[i].items()}
    data = Rows()
else:
    data = rows
if order != "args_first":
    args = build_args()
say(f"REPRO rank={rank} args built; pg={dist.is_initialized()} cur_dev={torch.cuda.current_device() if torch.cuda.is_available() else None}")
trainer = Trainer(model=model, args=args, train_dataset=data)
t = time.time()
trainer.train()
say(f"REPRO rank={rank} DONE steps={trainer.state.global_step} wrapper={type(trainer.model_wrapped).__name__} {time.time()-t:.1f}s")
