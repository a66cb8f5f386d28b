"""S10: the adapter you load is the adapter you saved, over the adapter features users use.

Teams train an adapter on one machine and serve it on another, a year later, with newer releases. A state dict whose
keys do not match loads without an error: missing keys are a warning at most, and the model then runs the base
weights, a fresh head or a fresh adapter, and gives plausible answers. S7 checks the save under FSDP and ZeRO-3; this
family checks the round trip itself over the features beyond a LoRA on q and v: `modules_to_save` heads, LoRA on the
embedding and the output layer, trainable tokens, `lora_bias`, DoRA, several adapters with related names, regex and
`all-linear` targets, rank and alpha patterns, and models whose own module names contain the words peft writes into
its keys (`scenarios/kit/named_models.py`).

One job: a tiny model (the named model, or a real tiny Llama) gets the config's adapters, each trained 2 AdamW steps
and moved by noise no loading process can regenerate; `save_pretrained`; then a fresh process builds the base from its
saved weights and loads the adapters (`PeftModel.from_pretrained`, then `load_adapter`; or `load_adapter` into a model
holding another adapter). The reference is the base with the saved file's tensors applied by the formulas in float64
(`scenarios/kit/roundtrip.py`), with the scaling the saving model used. Legs, each with its discrepancy, the scale
(what the adapter changes in the logits) and the float32 round-off floor:

- `check-roundtrip-save`: the saving model's logits are off the file's formula model (the file does not hold what was
  trained: keys the model does not have, a head left out);
- `check-roundtrip-load`: the loaded model's logits are off it (the load dropped, renamed or misplaced keys; the
  record lists which, and what ran instead);
- `check-roundtrip-keys`: the logits agree but the load dropped or moved keys (and why they still agree is said);
- `check-roundtrip-merge`: `merge_and_unload()` of the loaded model is off it;
- `check-roundtrip-unmerge`: the loaded model after `merge_adapter()` then `unmerge_adapter()`, run with its adapters
  disabled, is off the base (float64): the unmerge did not give the base weights back. S9 merge covers LoRA, DoRA and
  `lora_bias` on plain linear layers; here the same over the embedding, the output layer, heads, trainable tokens,
  related adapter names and module names.

Not covered here: quantized bases (S9 merge covers QLoRA merges), tied embeddings, Conv layers.
"""

from __future__ import annotations

import os
from typing import Any

from scenarios.kit import identities, measured, named_models, strategies

SPEC = {
    "id": "S10-adapter-roundtrip",
    "title": "Adapter round trip: the adapter a fresh process loads computes what the saved one did",
    # Silent round trips reported upstream in the atlas's window (module names with the adapter's name or "weight",
    # adapters whose names are prefixes of each other or a module's, modules_to_save names, an adapter named "lora").
    "known_issues": [
        "huggingface/peft#2772",
        "huggingface/peft#3282",
        "huggingface/peft#3584",
        "huggingface/peft#3433",
        "huggingface/peft#2289",
        "huggingface/peft#2252",
        "huggingface/peft#2195",
        "huggingface/peft#2038",
    ],
    "world_size": 1,
    "device": "any",
    "requires": ["torch", "peft", "safetensors"],
    "target": ["check-roundtrip-*"],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "save_pretrained, then PeftModel.from_pretrained / load_adapter in a fresh process"),
    },
    "in_step_failures": ["check:roundtrip-"],
    "table_metrics": ["off_by"],
    # Each config is a feature of its own (a head, an embedding, a name): flips are named per config.
    "flips_per_config": True,
    # No setup key: a file saved and loaded is the same file under the Trainer, a loop by hand, or any engine; the
    # adapter kind comes from the config.
    # What sets a failing config apart, in words a user can check on their own model (the judge's "applies if").
    "details": {
        "modules_to_save=True": "a modules_to_save head",
        "embed=True": "a LoRA on the embedding",
        "head=True": "a LoRA on the output layer",
        "trainable_tokens=True": "trainable tokens",
        "lora_bias=True": "lora_bias=True",
        "rslora=True": "use_rslora=True",
        "adapters": "adapters named {value}",
        "names.extra": "the modules_to_save head is named {value}",
        "heads": "modules_to_save heads named {value}",
        "names.q": "a LoRA target is named {value}",
        "names.v": "a LoRA target is named {value}",
        "names.o": "a layer is named {value}",
        "names.up": "a layer is named {value}",
        "names.layers": "the blocks' container is named {value}",
        "names.embed": "the embedding is named {value}",
        "names.head": "the output layer is named {value}",
        "model=llama": "",
        "load=load_adapter": "loaded with load_adapter",
        "targets=regex": "targets given as a regex",
        "targets=all-linear": "targets 'all-linear'",
    },
    #: Words peft writes into its keys: a module name that contains one is said to.
    "reserved_words": ["lora_", "base_layer", "weight", "modules_to_save", "default"],
}

SEED: dict[str, Any] = {
    "model": "named",
    "names": dict(named_models.PLAIN),
    "adapter": "lora",
    "targets": "list",
    "embed": False,
    "head": False,
    "modules_to_save": False,
    "trainable_tokens": False,
    "lora_bias": False,
    "rslora": False,
    "patterns": "none",
    "r": 8,
    "alpha": 16,
    "adapters": ["default"],
    "load": "from_pretrained",
}
#: Several adapters with related names: prefixes of each other, or a module's name.
ADAPTER_SETS = [["default"], ["default", "other"], ["a", "a_b"], ["adapter", "adapter_1"], ["default", "q"],
                ["q", "default"]]  # fmt: skip
#: Names a draw combines freely (1 to 3 of them, any order): prefixes of each other (`a`, `a_b`, `ab`; `default`,
#: `default_1`), a module's name (`q`), and peft's own words (`lora`, `weight`).
ADAPTER_POOL = ["default", "default_1", "a", "a_b", "ab", "q", "lora", "weight"]
#: The string-hash seeds a config with several modules_to_save heads is loaded under, one fresh process each.
HASH_SEEDS = ["0", "1", "2", "3"]
#: Keys a config has only where it differs from the seed (a config without them keeps its id from before they were
#: drawn): the modules_to_save heads.
OPTIONAL_KEYS = ("heads",)


def _names() -> Any:
    from hypothesis import strategies as st

    def unique(names: dict[str, str]) -> bool:
        inner = [names[s] for s in ("q", "v", "o", "up")]
        outer = [names[s] for s in ("layers", "embed", "head", "extra")]
        return len(set(inner)) == 4 and len(set(outer)) == 4

    return st.fixed_dictionaries(
        {slot: st.sampled_from(named_models.CHOICES[slot]) for slot in named_models.SLOTS}
    ).filter(unique)


def strategy() -> Any:
    from hypothesis import strategies as st

    anywhere = st.fixed_dictionaries(
        {
            "model": strategies.axis(SEED, "model", "llama"),
            "names": _names(),
            "adapter": strategies.axis(SEED, "adapter", "dora"),
            "targets": strategies.axis(SEED, "targets", "regex", "all-linear"),
            "embed": strategies.axis(SEED, "embed", True),
            "head": strategies.axis(SEED, "head", True),
            "modules_to_save": strategies.axis(SEED, "modules_to_save", True),
            "trainable_tokens": strategies.axis(SEED, "trainable_tokens", True),
            "lora_bias": strategies.axis(SEED, "lora_bias", True),
            "rslora": strategies.axis(SEED, "rslora", True),
            "patterns": strategies.axis(SEED, "patterns", "rank", "alpha"),
            "r": strategies.axis(SEED, "r", 4),
            "alpha": strategies.axis(SEED, "alpha", 8),
            "adapters": st.one_of(
                st.sampled_from(ADAPTER_SETS),
                st.lists(st.sampled_from(ADAPTER_POOL), min_size=1, max_size=3, unique=True),
            ),
            "load": strategies.axis(SEED, "load", "load_adapter"),
            "heads": st.lists(st.sampled_from(named_models.HEAD_CHOICES), min_size=1, max_size=3, unique=True),
        }
    )
    keys = [*(k for k in SEED if k != "model"), *OPTIONAL_KEYS]
    return strategies.near_seed(SEED, anywhere, keys, max_changes=3).map(normalized)


def normalized(config: dict[str, Any]) -> dict[str, Any]:
    """A config the features allow together: `all-linear` on the real model only (peft refuses it on others);
    DoRA on linear layers only, without `lora_bias`; trainable tokens not on an embedding LoRA also targets; the
    Llama's output layer either LoRA-targeted or kept whole."""
    config = dict(config)
    if config.get("heads"):  # heads are what modules_to_save keeps; never the model's own top-level names
        names = {**named_models.PLAIN, **(config.get("names") or {})}
        heads = [h for h in config["heads"] if h not in (names["embed"], names["layers"], names["head"])]
        config.pop("heads")
        if heads and config["model"] != "llama":
            config.update(heads=heads, modules_to_save=True)
    if config["targets"] == "all-linear" and config["model"] != "llama":
        config["targets"] = "list"
    if config["adapter"] == "dora":
        config.update(embed=False, head=False, lora_bias=False)
    if config["trainable_tokens"]:
        config["embed"] = False
    if config["model"] == "llama":
        config["names"] = dict(named_models.PLAIN)
        if config["modules_to_save"]:
            config["head"] = False
    return config


EXAMPLES = [
    normalized(config)
    for config in [
        SEED,
        strategies.seed_config(SEED, embed=True, head=True),
        strategies.seed_config(SEED, modules_to_save=True),
        strategies.seed_config(SEED, adapter="dora"),
        strategies.seed_config(SEED, lora_bias=True),
        strategies.seed_config(SEED, trainable_tokens=True),
        strategies.seed_config(SEED, adapters=["a", "a_b"], modules_to_save=True),
        strategies.seed_config(SEED, targets="regex", patterns="alpha"),
        strategies.seed_config(
            SEED, names={**named_models.PLAIN, "q": "default_q", "v": "base_layer_v", "o": "weight"}
        ),
        strategies.seed_config(SEED, names={**named_models.PLAIN, "extra": "lora_head"}, modules_to_save=True),
        strategies.seed_config(SEED, adapters=["default", "q"]),
        strategies.seed_config(SEED, model="llama", targets="all-linear", embed=True),
        # Layouts each with one trigger alone, so that a flip of one names what its config really has: two and three
        # heads whose names are prefixes of each other, a head named after a LoRA target, targets whose names
        # contain `weight`, `bias`, `lora_` and `base_layer`, and two adapters one the prefix of the other.
        strategies.seed_config(SEED, heads=["score", "score_1"]),
        strategies.seed_config(SEED, heads=["score", "score_1", "score_10"]),
        strategies.seed_config(SEED, heads=["q_head"]),
        strategies.seed_config(SEED, names={**named_models.PLAIN, "v": "weight"}),
        strategies.seed_config(SEED, names={**named_models.PLAIN, "q": "bias_q"}),
        strategies.seed_config(SEED, names={**named_models.PLAIN, "q": "lora_q"}),
        strategies.seed_config(SEED, names={**named_models.PLAIN, "v": "base_layer_v"}),
        strategies.seed_config(SEED, adapters=["default", "default_1"]),
    ]
]


def run(config: dict[str, Any], variant: str, ctx: dict[str, Any]) -> dict[str, Any]:
    import torch

    measured.start(ctx)
    from scenarios.kit import roundtrip

    why_not = roundtrip.supported(config)
    measured.require(not why_not, why_not)
    adapters = list(config.get("adapters", ["default"]))
    batch = {"input_ids": torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(3))}
    root = os.path.join(ctx["workdir"], "saved")
    kept = roundtrip.save(config, batch, root)
    measured.note(adapters=adapters, load=config.get("load"), model=config.get("model"),
                  adapted_modules=sorted(kept[adapters[0]]["scalings"]))  # fmt: skip
    batch_file = identities.tensors_to_file(batch, os.path.join(ctx["workdir"], "batch.pt"))
    payload = {"config": config, "root": root, "batch": batch_file}
    if not several_heads(config):
        return judge(config, root, identities.in_fresh_process(roundtrip.load, payload, ctx))
    # Several modules_to_save heads: peft keeps them in a set, so which saved head a load matches can depend on the
    # string hash of the process (peft#2289, the match made order-free by PR #2334). One load per fixed hash seed,
    # each judged; the first that fails is the outcome, and the record says which seeds failed.
    from scenarios.compat import CheckFailed

    outcomes: dict[str, str] = {}
    first: CheckFailed | None = None
    result: dict[str, Any] = {}
    for seed in HASH_SEEDS:
        loaded = identities.in_fresh_process(roundtrip.load, payload, ctx, env={"PYTHONHASHSEED": seed})
        try:
            result = judge(config, root, loaded)
            outcomes[seed] = "pass"
        except CheckFailed as exc:
            outcomes[seed] = exc.check
            first = first or exc
    measured.note(load_hash_seeds=outcomes)
    if first is not None:
        first.metrics["load_hash_seeds"] = outcomes
        raise first
    result.setdefault("metrics", {})["load_hash_seeds"] = outcomes
    return result


def several_heads(config: dict[str, Any]) -> bool:
    """Whether the config has several modules_to_save heads: its load is judged under each of `HASH_SEEDS`."""
    return bool(config.get("modules_to_save")) and len(named_models.heads_of(config)) > 1


def judge(config: dict[str, Any], root: str, loaded: dict[str, Any]) -> dict[str, Any]:
    """Each adapter's legs against the formula model of its saved file (float64), then the keys."""
    import torch

    from scenarios.kit import roundtrip

    batch_ids = identities.tensors_from_file(os.path.join(os.path.dirname(root), "batch.pt"))["input_ids"]
    saved_logits = identities.tensors_from_file(os.path.join(root, "saved-logits.pt"))
    loaded_logits = identities.tensors_from_file(loaded["logits"])
    loaded_tensors = identities.tensors_from_file(loaded["tensors"])
    merged_logits = identities.tensors_from_file(loaded["merged"])
    unmerged_logits = identities.tensors_from_file(loaded["unmerged"]) if loaded.get("unmerged") else {}
    base = named_models.build(config)
    from safetensors.torch import load_file

    base.load_state_dict(load_file(os.path.join(root, "base.safetensors")))
    metrics: dict[str, Any] = {"said": loaded.get("said", []), "load_results": loaded.get("load_results", {})}
    failures: list[tuple[str, dict[str, Any], str]] = []
    with torch.no_grad():
        base_rounded = base(input_ids=batch_ids).logits.double()
        base_logits = base.double()(input_ids=batch_ids).logits
        for adapter in config.get("adapters", ["default"]):
            exact_model, nowhere = roundtrip.formula_model(config, root, adapter, torch.float64)
            float_model, _ = roundtrip.formula_model(config, root, adapter, torch.float32)
            reference = {"logits": exact_model(input_ids=batch_ids).logits}
            rounded = {"logits": float_model(input_ids=batch_ids).logits.double()}
            effect = {"logits": reference["logits"] - base_logits}
            _, _, unknown = roundtrip.saved_parts(root, adapter)
            keys = roundtrip.key_report(root, adapter, loaded_tensors)
            legs = {
                "save": identities.compare({"logits": saved_logits[adapter]}, reference, rounded, effect),
                "load": identities.compare({"logits": loaded_logits[adapter]}, reference, rounded, effect),
            }
            if adapter in merged_logits:
                legs["merge"] = identities.compare({"logits": merged_logits[adapter]}, reference, rounded, effect)
            if adapter in unmerged_logits:
                legs["unmerge"] = _unmerge_leg(unmerged_logits[adapter], base_logits, base_rounded, effect,
                                               legs["load"]["floor"])  # fmt: skip
            metrics[adapter] = {
                **{leg: identities.rounded(c) for leg, c in legs.items()},
                "keys": keys,
                "file_names_modules_not_in_model": nowhere,
                "file_keys_of_no_known_part": unknown,
            }
            for leg, comparison in legs.items():
                if not identities.holds(comparison):
                    failures.append((leg, comparison, adapter))
            if identities.holds(legs["load"]) and any(keys[k] for k in ("not_saved", "foreign", "dropped", "moved")):
                failures.append(("keys", legs["load"], adapter))
    first = next(iter(config.get("adapters", ["default"])))
    metrics.update(identities.rounded(metrics[first]["load"]))
    raised = {"merge": "merge_and_unload() of the loaded model", "unmerge": "merge_adapter(), then unmerge_adapter()"}
    for leg in ("save", "load", "keys", "merge", "unmerge"):
        for name, comparison, adapter in failures:
            if name == leg:
                _fail(leg, comparison, adapter, metrics)
        if leg in raised and loaded.get(f"{leg}_error"):
            from scenarios.compat import CheckFailed

            metrics[f"{leg}_error"] = loaded[f"{leg}_error"]
            raise CheckFailed(f"roundtrip-{leg}", f"{raised[leg]} raised {loaded[f'{leg}_error']}", metrics)
    return {"metrics": metrics, "path": "from_pretrained" if config.get("load") != "load_adapter" else "load_adapter"}


def _unmerge_leg(unmerged: Any, base: Any, base_rounded: Any, effect: dict[str, Any], adapted_floor: float) -> dict:
    """The loaded model merged, unmerged and run with its adapters disabled, against the base in float64. The scale is
    the adapter's effect (what is left of the adapter, in its own units); the floor is the larger of the base's and
    the adapted model's float32 round-off, since the merge adds and the unmerge subtracts at the adapted weights'."""
    return identities.compare({"logits": unmerged}, {"logits": base}, {"logits": base_rounded}, effect,
                              floor_at_least=adapted_floor)  # fmt: skip


def _fail(leg: str, comparison: dict[str, Any], adapter: str, metrics: dict[str, Any]) -> None:
    keys = metrics[adapter]["keys"]
    words = {"not_saved": "trained but not in the file", "foreign": "in the file but not this adapter's",
             "dropped": "in the file, not loaded", "moved": "loaded into another module",
             "not_from_file": "loaded at fresh values"}  # fmt: skip
    found = "; ".join(f"{words[k]}: {', '.join(keys[k][:2])}{f' (+{len(keys[k]) - 2})' if len(keys[k]) > 2 else ''}"
                      for k in words if keys[k]) or "every key where it was saved"  # fmt: skip
    where = {
        "save": f"adapter {adapter!r}: the saving model's logits (the file does not hold what was trained; {found})",
        "load": f"adapter {adapter!r}: the loaded model's logits ({found})",
        "merge": f"adapter {adapter!r}: merge_and_unload() of the loaded model",
        "unmerge": f"adapter {adapter!r}: the loaded model merged, unmerged and run with its adapters disabled (the "
        "base it should give back)",
    }
    if leg == "keys":
        detail = (f"adapter {adapter!r}: {found}; the logits agree within {comparison['off_by']:.3g}x the adapter's "
                  "effect, so those keys do not reach these logits")  # fmt: skip
        from scenarios.compat import CheckFailed

        raise CheckFailed("roundtrip-keys", detail, identities.rounded({**metrics, **comparison}))
    identities.fail(f"roundtrip-{leg}", comparison, where[leg], metrics, of="the adapter's effect")
