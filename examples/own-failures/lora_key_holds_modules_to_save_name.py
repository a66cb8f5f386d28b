"""A LoRA target whose name holds a `modules_to_save` module's name: the LoRA does not load back.

peft up to 0.14 puts a `modules_to_save` module's adapter name back into the saved keys by a substring match
(`set_peft_model_state_dict`: every key that contains the module's name gets `.modules_to_save.<adapter>` inserted
after it), so a LoRA on `head_proj` beside a saved `head` is loaded under a key no module has, and its weights stay
as initialised. A tiny model keeps a `head_proj` layer (the LoRA's target) and a `head` (saved whole); the LoRA is
moved by noise no load can regenerate, saved with `save_pretrained` and loaded on a fresh base with
`PeftModel.from_pretrained`. The loaded model's logits must be the saving model's, to float32 round-off. Exit 1 with
the script's own message (the adapter did not load back), or 0.
"""

import sys
import tempfile

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head_proj = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.head_proj(self.embed(input_ids))))


def main() -> None:
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(0)
    base = Tiny()
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["head_proj"], modules_to_save=["head"])
    model = get_peft_model(base, config)
    noise = torch.Generator().manual_seed(7919)  # values a load cannot regenerate from the global seed
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=noise))
        model.eval()
        saved = model(ids)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        fresh = Tiny()
        fresh.load_state_dict(base_state)
        loaded = PeftModel.from_pretrained(fresh, folder).eval()
        with torch.no_grad():
            off = (loaded(ids) - saved).abs().max().item()
    print(f"peft {peft.__version__}: the loaded logits are off the saved model's by {off:.3g}")
    if off > 1e-5:
        sys.exit(f"the LoRA on head_proj did not load back beside modules_to_save=['head']: logits off by {off:.3g}")
    print("the adapter loads back")


if __name__ == "__main__":
    main()
