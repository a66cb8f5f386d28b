"""The scenario kit: what every scenario needs and none should write again.

- `models`: tiny Llama models built from configs in code (no hub), saving and loading them, token batches.
- `adapters`: target-module sets, LoRA/DoRA configs, adapter dtypes, trainable parameters.
- `fsdp`: FSDP1/FSDP2 wrapping the way accelerate does it, mixed precision, activation checkpointing.
- `zero`: DeepSpeed ZeRO configs, gathered snapshots, cleanup.
- `trainer`: the HF `Trainer` path (arguments, data, which FSDP ran) with its cleanup.
- `distributed`: what ranks agree on (mean over ranks, a setup barrier).
- `checks`: the common checks, under one set of names (`finite_loss`, `adapters_changed`, ...).
- `strategies`: Hypothesis building blocks (the seed's value first, near-seed draws).

Like every scenario module, the kit imports only the standard library (and `hypothesis`) at import time: the
orchestrator imports scenarios to read their specs. The stack is imported inside functions. Reproducers
embed the kit modules a scenario imports, verbatim.
"""
