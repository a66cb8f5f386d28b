"""A module whose name holds peft's `lora_` prefix: the LoRA under it does not load back, and nothing says so.

S10's draws found it on peft 0.12.0 (a model whose layer container is named `lora_layers`); the same unanchored
`lora_` match as peft#3433 (a `modules_to_save` head named `lora_head`), on a plain module. A tiny model keeps its
layers under `lora_layers`; a LoRA on their `q` and `v` is trained two steps and moved by noise no load can
regenerate, saved with `save_pretrained`, and loaded on a fresh base with `PeftModel.from_pretrained`. The loaded
model's logits must be the saving model's, to float32 round-off. Exit 1 (the adapter did not load back) or 0.
"""

import sys
import tempfile

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.v = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.q(h)) * self.v(h)


class Tiny(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lora_layers = nn.ModuleList([Block(width), Block(width)])
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.lora_layers:
            h = block(h)
        return self.head(h)


def main() -> int:
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(0)
    base = Tiny()
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        model(ids).float().logsumexp(-1).mean().backward()
        optimizer.step()
    noise = torch.Generator().manual_seed(7919)  # values a load cannot regenerate from the global seed
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.add_(0.05 * torch.randn(param.shape, generator=noise))
        model.eval()
        saved = model(ids)
        with model.disable_adapter():
            effect = (saved - model(ids)).abs().max().item()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        torch.manual_seed(4242)
        fresh = Tiny()
        fresh.load_state_dict(base_state)
        loaded = PeftModel.from_pretrained(fresh, folder).eval()
        with torch.no_grad():
            off = (loaded(ids) - saved).abs().max().item()
    print(f"peft {peft.__version__}: the loaded logits are off the saved model's by {off:.3g} "
          f"(the adapter's effect {effect:.3g})")
    if off > 1e-5 * max(effect, 1.0):
        print("FAIL: the adapter did not load back", file=sys.stderr)
        return 1
    print("the adapter loads back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
