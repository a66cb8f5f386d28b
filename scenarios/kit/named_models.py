"""A tiny causal LM whose own module names are drawn (S10): names that contain the words peft writes into its state
dict keys (`lora_`, `weight`, `base_layer`, `modules_to_save`, the adapter's name) and names that are prefixes of each
other. peft maps a saved key back to a module by its name; a model's names that share words with peft's keys are
where that mapping can go wrong silently. The same seed builds the same weights in every process."""

from __future__ import annotations

from typing import Any

#: The model's slots: a container of blocks, four linears per block (q, v, o, up), the embedding, the output layer,
#: and an extra head after it (the module `modules_to_save` keeps).
SLOTS = ("layers", "q", "v", "o", "up", "embed", "head", "extra")
#: The plain names of the seed config.
PLAIN = {"layers": "layers", "q": "q", "v": "v", "o": "o", "up": "up", "embed": "embed", "head": "head",
         "extra": "score"}  # fmt: skip
#: What a draw may name each slot (the plain name first, so a shrunk failure keeps only the names it needs).
CHOICES: dict[str, list[str]] = {
    "layers": ["layers", "lora_layers", "blocks", "default"],
    "q": ["q", "q_proj", "lora_q", "default_q", "weight_q", "q_weight", "bias_q", "base_layer_q"],
    "v": ["v", "q_proj_v", "v_proj", "base_layer_v", "lora_B", "v_bias", "weight", "lora_v"],
    "o": ["o", "o_proj", "q_out", "weight", "default"],
    "up": ["up", "up_proj", "upx", "lora_up", "modules_to_save_up"],
    "embed": ["embed", "embed_tokens", "lora_embedding", "embed_default"],
    "head": ["head", "lm_head", "head_weight", "base_layer"],
    "extra": ["score", "modules_to_save", "lora_head", "score_default", "head_extra"],
}
#: What a draw may name the `modules_to_save` heads (1 to 3, config key `heads`, applied in order after the output
#: layer): names that are prefixes of each other (`score`, `score_1`, `score_10`) and of a LoRA target's or contain
#: one (`q`, `q_head`), and names with peft's words in them. A config without `heads` keeps the one `extra` slot.
HEAD_CHOICES = ["score", "score_1", "score_10", "q", "q_head", "v_out", "lora_score", "score_weight", "bias"]
#: The tiny Llama's names for the same slots (`model = "llama"`: a real transformers model).
LLAMA = {"layers": "layers", "q": "q_proj", "v": "v_proj", "o": "o_proj", "up": "up_proj", "embed": "embed_tokens",
         "head": "lm_head", "extra": "lm_head"}  # fmt: skip


def names_of(config: dict[str, Any]) -> dict[str, str]:
    return dict(LLAMA) if config.get("model") == "llama" else {**PLAIN, **(config.get("names") or {})}


def heads_of(config: dict[str, Any]) -> list[str]:
    """The named model's heads after the output layer, in order: the config's `heads`, else the one `extra`."""
    return list(config.get("heads") or [names_of(config)["extra"]])


def build(config: dict[str, Any], seed: int = 0) -> Any:
    """The config's base model (fp32, seed `seed`): the tiny Llama, or the named model."""
    import torch

    if config.get("model") == "llama":
        from scenarios.kit.models import tiny_llama

        model = tiny_llama(hidden=32, layers=2, vocab=64, seed=seed)
        model.eval()
        return model
    torch.manual_seed(seed)
    model = _named_class()(names_of(config), hidden=32, vocab=64, blocks=2, heads=heads_of(config))
    model.eval()
    return model


def _named_class() -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, names: dict[str, str], hidden: int) -> None:
            super().__init__()
            self._slots = {slot: names[slot] for slot in ("q", "v", "o", "up")}
            for name in self._slots.values():
                self.add_module(name, nn.Linear(hidden, hidden))

        def forward(self, x: Any) -> Any:
            q, v, o, up = (getattr(self, self._slots[s]) for s in ("q", "v", "o", "up"))
            x = x + o(torch.tanh(q(x)) * v(x))
            return x + up(torch.relu(x))

    class NamedLM(nn.Module):
        """Embedding, blocks, output layer, heads: logits = heads[-1](...heads[0](head(blocks(embed(ids)))))."""

        def __init__(self, names: dict[str, str], hidden: int, vocab: int, blocks: int, heads: list[str]) -> None:
            super().__init__()
            self._names = names
            self._heads = heads
            self.add_module(names["embed"], nn.Embedding(vocab, hidden))
            self.add_module(names["layers"], nn.ModuleList(Block(names, hidden) for _ in range(blocks)))
            self.add_module(names["head"], nn.Linear(hidden, vocab))
            for name in heads:
                self.add_module(name, nn.Linear(vocab, vocab))

        def get_input_embeddings(self) -> Any:
            return getattr(self, self._names["embed"])

        def forward(self, input_ids: Any = None, attention_mask: Any = None, **_: Any) -> Any:
            x = getattr(self, self._names["embed"])(input_ids)
            for block in getattr(self, self._names["layers"]):
                x = block(x)
            logits = getattr(self, self._names["head"])(x)
            for name in self._heads:
                logits = getattr(self, name)(logits)
            return _Output(logits)

        def prepare_inputs_for_generation(self, *args: Any, **kwargs: Any) -> Any:  # peft's causal-LM wrapper asks
            return kwargs

    return NamedLM


class _Output:
    """What a transformers model returns, as far as the scenario reads it (`.logits`)."""

    def __init__(self, logits: Any) -> None:
        self.logits = logits

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)
