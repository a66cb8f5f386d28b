"""LoRA targets whose names hold `weight` (`to_weight`, `weight_proj`): saved, then loaded in a fresh process, the
LoRA is not there ([peft#2772](https://github.com/huggingface/peft/issues/2772)).

peft up to 0.17 puts the adapter's name back into a loaded key by replacing the parameter's suffix (`weight`)
wherever it occurs in the key (`_insert_adapter_name_into_state_dict`), so `to_weight.lora_A.weight` becomes
`to_default.weight.lora_A.default.weight`: no module has it, and the LoRA stays as initialised. A tiny model with
two such layers gets a LoRA moved by noise no load can regenerate, saved with `save_pretrained`; a fresh Python
process (as a user's serving job would) builds the same base, loads the adapter with `PeftModel.from_pretrained` and
compares its logits with the saving model's. Exit 1 with the script's own message, or 0.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.to_weight = nn.Linear(width, width)
        self.weight_proj = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        return self.head(torch.tanh(self.to_weight(h)) * self.weight_proj(h))


def base() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


IDS = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))


def save(folder: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base(), LoraConfig(r=4, lora_alpha=8, target_modules=["to_weight", "weight_proj"]))
    noise = torch.Generator().manual_seed(7919)  # values a load cannot regenerate from the global seed
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=noise))
        torch.save(model.eval()(IDS), folder / "logits.pt")
    model.save_pretrained(folder / "adapter")


def load(folder: Path) -> None:
    """In the fresh process: the same base, the adapter loaded, the logits compared."""
    import peft
    from peft import PeftModel

    loaded = PeftModel.from_pretrained(base(), folder / "adapter").eval()
    with torch.no_grad():
        off = (loaded(IDS) - torch.load(folder / "logits.pt")).abs().max().item()
    print(f"peft {peft.__version__}: the loaded logits are off the saved model's by {off:.3g}")
    if off > 1e-5:
        sys.exit(f"the LoRA on to_weight and weight_proj did not load back: logits off by {off:.3g}")


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        save(folder)
        child = subprocess.run([sys.executable, __file__, "load", str(folder)], capture_output=True, text=True)
        sys.stdout.write(child.stdout)
        sys.stderr.write(child.stderr)
        if child.returncode != 0:
            said = [line for line in child.stderr.splitlines() + child.stdout.splitlines() if "did not load" in line]
            sys.exit(said[-1] if said else f"the fresh process that loads the adapter exited {child.returncode}")
    print("the adapter loads back in a fresh process")


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:
        load(Path(sys.argv[2]))
    else:
        main()
