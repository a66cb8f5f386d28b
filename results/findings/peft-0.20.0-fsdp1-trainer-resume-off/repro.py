# /// script
# requires-python = ">=3.10"
# dependencies = ["torch==2.11.0", "transformers==5.14.1", "peft==0.20.0", "accelerate==1.14.0"]
# ///
"""A LoRA run of the HF Trainer under FSDP1, stopped at a checkpoint and resumed with `resume_from_checkpoint` in new
processes, does not end where the uninterrupted run ends (peft 0.20.0): it trains on, its loss looks fine, and its
adapter is somewhere else. peft 0.19.1 resumes exactly on the same stack (transformers 5.14.1, accelerate 1.14.0, the
stack of the 2026-07-29 install day, where peft 0.20.0 came); peft 0.21.x over transformers 5.17 and 5.24 is off alike.

Needs 2 GPUs (the Trainer runs FSDP on GPUs only). A tiny Llama (built from a config, no download), LoRA r 8 on
q_proj/v_proj, `fsdp="full_shard auto_wrap"` with FSDP version 1 and `use_orig_params=True`, AdamW lr 1e-2 with the
linear schedule, 4 steps over 4 rows of 16 tokens (one global batch a step), fp32. Three legs: the uninterrupted run;
the same run saving `checkpoint-2` and stopping there; then `trainer.train(resume_from_checkpoint=...)` in a new
torchrun (new processes, a new group). Each end is gathered in memory (`summon_full_params`) and compared with a
float64 replay of the same 4 AdamW steps by hand; the float32 replay gives the round-off floor. Exit 1 with one line
when the resumed end is off while the uninterrupted end holds, 0 when both hold. Run: `uv run repro.py`.
"""

import os
import subprocess
import sys
import tempfile

import torch

STEPS, STOP_AT, LR, ROWS, SEQ, WORLD = 4, 2, 1e-2, 4, 16, 2
#: A run holds when it is within this many round-off floors of the float64 replay.
MARGIN = 50.0


def build_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip
    model = LlamaForCausalLM(config)
    torch.manual_seed(5)
    lora = LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


def rows():
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(ROWS):
        ids = torch.randint(0, 128, (SEQ,), generator=gen)
        out.append({"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": ids.clone()})
    return out


def clean(name):
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def train(output_dir, stop=False, resume=None):
    """The Trainer under FSDP1 for up to STEPS steps: straight through, or saving checkpoint-2 and stopping there, or
    resuming from `resume`. Returns the gathered trainable tensors (every rank) and the step count."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    class StopAtCheckpoint(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= STOP_AT:
                control.should_training_stop = True
            return control

    class Rows(torch.utils.data.Dataset):
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __getitem__(self, index):
            return self.items[index]

    saving = {"save_strategy": "steps", "save_steps": STOP_AT} if stop or resume else {"save_strategy": "no"}
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=ROWS // WORLD, max_steps=STEPS, learning_rate=LR,
        optim="adamw_torch", lr_scheduler_type="linear", max_grad_norm=0.0, weight_decay=0.0, seed=0,
        report_to=[], logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        fsdp="full_shard auto_wrap",
        fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "use_orig_params": True, "version": 1},
        **saving,
    )  # fmt: skip
    trainer = Trainer(model=build_model(), args=args, train_dataset=Rows(rows()), data_collator=default_data_collator,
                      callbacks=[StopAtCheckpoint()] if stop else [])  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    wrapped = trainer.model_wrapped
    if not isinstance(wrapped, FSDP):
        raise RuntimeError(f"the Trainer did not train under FSDP1: {type(wrapped).__name__}")
    with FSDP.summon_full_params(wrapped, writeback=False, rank0_only=False):
        end = {clean(n): p.detach().float().cpu().clone() for n, p in wrapped.named_parameters() if p.requires_grad}
    return end, int(trainer.state.global_step)


def rank_main(phase, folder):
    """In each torchrun rank: the uninterrupted run and the run that stops at checkpoint-2, or the resume."""
    from accelerate.state import AcceleratorState

    rank = int(os.environ["RANK"])
    if phase == "train":
        end, steps = train(os.path.join(folder, "uninterrupted"))
        if rank == 0:
            torch.save({"end": end, "steps": steps}, os.path.join(folder, "uninterrupted.pt"))
        AcceleratorState._reset_state(True)
        train(os.path.join(folder, "stopped"), stop=True)
    else:
        checkpoint = os.path.join(folder, "stopped", f"checkpoint-{STOP_AT}")
        end, steps = train(os.path.join(folder, "stopped"), resume=checkpoint)
        if rank == 0:
            torch.save({"end": end, "steps": steps}, os.path.join(folder, "resumed.pt"))


def replay(dtype):
    """The trainable tensors after STEPS full-batch AdamW steps (betas 0.9/0.999, eps 1e-8, no decay, no clipping)
    with the linear schedule (step t uses LR * (STEPS - t) / STEPS) on the token mean of all rows, by hand on CPU."""
    model = build_model().to(dtype)
    params = {clean(n): p for n, p in model.named_parameters() if p.requires_grad}
    start = {n: p.detach().double().clone() for n, p in params.items()}
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    batch = {k: torch.stack([r[k] for r in rows()]) for k in ("input_ids", "attention_mask", "labels")}
    for t in range(STEPS):
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
        target = batch["labels"][:, 1:]
        (-log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)).mean().backward()
        rate = LR * (STEPS - t) / STEPS
        with torch.no_grad():
            for name, param in params.items():
                m, v = moments[name]
                m.mul_(0.9).add_(param.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(param.grad, param.grad, value=0.001)
                denom = (v.sqrt() / (1 - 0.999 ** (t + 1)) ** 0.5).add_(1e-8)
                param.addcdiv_(m, denom, value=-rate / (1 - 0.9 ** (t + 1)))
    return {n: p.detach().double() for n, p in params.items()}, start


def main():
    try:
        return judge()
    except Exception as exc:  # a broken run is no evidence either way: never exit 1 (the failure's code) for it
        print(f"ERROR: {type(exc).__name__}: {exc}")
        return 2


def judge():
    folder = tempfile.mkdtemp(prefix="resume-")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    for phase in ("train", "resume"):
        launched = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), __file__, phase, folder],
            env=env, timeout=600,
        )  # fmt: skip
        if launched.returncode != 0:
            print(f"ERROR: the {phase} leg's torchrun exited {launched.returncode} (every rank's output above)")
            return 2
    reference, start = replay(torch.float64)
    rounded, _ = replay(torch.float32)
    scale = max(float((reference[n] - start[n]).abs().max()) for n in reference)  # the adapter's change
    floor = max(float((rounded[n] - reference[n]).abs().max()) for n in reference)
    tolerance = MARGIN * max(floor, 1e-12 * scale)

    def off(end):
        return max(float((end[n].double() - reference[n]).abs().max()) for n in reference)

    whole, resumed = (torch.load(os.path.join(folder, f"{leg}.pt")) for leg in ("uninterrupted", "resumed"))
    straight, again = off(whole["end"]), off(resumed["end"])
    between = max(float((resumed["end"][n] - whole["end"][n]).abs().max()) for n in reference) / scale
    figures = (f"uninterrupted: {straight / scale:.2g}x, resumed: {again / scale:.2g}x the adapter's change off the "
               f"float64 replay (change {scale:.3g}, round-off floor {floor:.2g}, tolerance {tolerance:.2g}); "
               f"steps {whole['steps']} and {resumed['steps']}")  # fmt: skip
    if straight > tolerance:
        print(f"ERROR: the uninterrupted run itself is off, so resume cannot be judged: {figures}")
        return 2
    if again > tolerance or resumed["steps"] != STEPS:
        away = f"{between:.2g}x the adapter's change away from the uninterrupted run"
        print(f"FAIL: the resumed run ends {away}; {figures}")
        return 1
    print(f"ok: the resumed run ends where the uninterrupted run ends; {figures}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:
        rank_main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(main())
