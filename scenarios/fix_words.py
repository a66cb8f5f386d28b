"""Fix and workaround names in words, for readers: the one table the glance, `lookup`, `check`, the advisories, `audit`
and the site share. A variant's name joins its changes with '+' ('flip_use_orig_params+decoder_layer_wrap+
uniform_dtype'); its words group them by what they change ('FSDP: use_orig_params flipped, wrap each decoder layer,
one dtype'). The scenario's own description (longer, exact) stays in the records and the variant tables."""

from __future__ import annotations

#: change -> (what it changes, or None: the group of the change before it; the change in a few words).
FIX_WORDS: dict[str, tuple[str | None, str]] = {
    "autocast_adapter_dtype_false": ("PEFT", "autocast_adapter_dtype=False"),
    "average_tokens_off": ("Trainer", "average_tokens_across_devices=False"),
    "average_tokens_on": ("Trainer", "average_tokens_across_devices=True"),
    "cast_forward_inputs": ("FSDP", "MixedPrecision(cast_forward_inputs=True)"),
    "cast_result_to_input_dtype": ("DoRA", "cast its result to the input's dtype (a local patch)"),
    "decoder_layer_wrap": ("FSDP", "wrap each decoder layer"),
    "device_map_local": ("loading", "device_map={'': local_rank}"),
    "enable_input_require_grads": ("model", "enable_input_require_grads()"),
    "eval_first": ("training", "one no-grad forward first"),
    "flip_use_orig_params": ("FSDP", "use_orig_params flipped"),
    "fsdp2": ("FSDP", "FSDP2 instead of FSDP1"),
    "full_state_dict_checkpoint": ("FSDP", "checkpoints as FULL_STATE_DICT"),
    "full_state_dict_on_save": ("FSDP", "FULL_STATE_DICT before save_model"),
    "gather_16bit_on_save": ("DeepSpeed", "stage3_gather_16bit_weights_on_model_save=true"),
    "gathered_parameters": ("DeepSpeed", "save inside GatheredParameters on rank 0"),
    "global_token_mean": ("loss", "token mean all-reduced over ranks"),
    "gloo_beside_nccl": ("process group", "gloo beside NCCL"),
    "grad_accum": ("measured with", "2 accumulation steps"),
    "grad_clip": ("measured with", "gradient clipping"),
    "grad_scaler": ("measured with", "a GradScaler"),
    "input_grads": ("model", "enable_input_require_grads()"),
    "mask_first_label": ("labels", "the first label of each row -100"),
    "no_accumulation": ("training", "one batch, no accumulation"),
    "no_autocast": ("training", "no autocast around the forward"),
    "no_token_averaging": ("Trainer", "average_tokens_across_devices=False"),
    "partial_checkpointing": ("checkpointing", "only the first layer"),
    "peft_then_compile": ("order", "get_peft_model, then torch.compile"),
    "prepare_model_for_kbit_training": ("PEFT", "prepare_model_for_kbit_training first"),
    "reload_then_merge": ("QLoRA", "reload the 4-bit base with the adapter, then merge"),
    "save_by_key": ("saving", "pick the adapter's tensors by name"),
    "seed_misspelled_api": ("seed code", "the article's misspelled probe"),
    "set_device_first": ("process group", "set_device before init_process_group"),
    "sharded_state_dict_checkpoint": ("FSDP", "checkpoints as SHARDED_STATE_DICT"),
    "strip_orig_mod_prefix": ("saving", "strip '_orig_mod.' from the keys"),
    "summon_full_params": ("FSDP", "save inside summon_full_params"),
    "trainer_starts_group": ("process group", "the Trainer starts it"),
    "uniform_dtype": (None, "one dtype"),
    "use_orig_params": ("FSDP", "use_orig_params=True"),
    "use_reentrant": ("checkpointing", "use_reentrant=True"),
    "use_reentrant_false": ("checkpointing", "use_reentrant=False"),
    "window_token_mean": ("loss", "summed over the window's tokens"),
    "zero2": ("DeepSpeed", "ZeRO-2 instead of ZeRO-3"),
}


def fix_words(variant: str) -> str:
    """'FSDP: use_orig_params flipped, wrap each decoder layer, one dtype' for a variant's name; a change the table
    does not know keeps its name (a test holds every scenario's changes in the table)."""
    groups: list[tuple[str, list[str]]] = []
    for change in variant.split("+"):
        group, words = FIX_WORDS.get(change, ("", change))
        if group is None and groups:
            groups[-1][1].append(words)
        elif groups and groups[-1][0] == (group or ""):
            groups[-1][1].append(words)
        else:
            groups.append((group or "", [words]))
    return "; ".join(f"{g}: {', '.join(ws)}" if g else ", ".join(ws) for g, ws in groups)


def unknown_changes(variants: list[str]) -> list[str]:
    """The changes of these variants the table has no words for."""
    return sorted({c for v in variants if v != "baseline" for c in v.split("+") if c not in FIX_WORDS})
