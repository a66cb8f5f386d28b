"""The names of the stack's known failures: message or traceback pattern -> stable name -> upstream links.

These are the scenarios' own rules (the failure modes they reproduce and the other failures they run into),
kept on the scenario side of the house: `harness/recording/signatures.py` holds only the generic names (timeout,
crash, OOM, our own bugs, unclassified) and asks this module first. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: name (or the family before `[`) -> upstream threads.
KNOWN_ISSUES: dict[str, list[str]] = {
    "checkpoint-recompute-dtype": [
        "huggingface/peft#1910",
        "huggingface/transformers#28499",
        "pytorch/pytorch#148831",
        "pytorch/pytorch#159359",
    ],
    "checkpoint-recompute-shape[0]": [
        "OpenRLHF/OpenRLHF#569",
        "huggingface/transformers#47254",
        "deepspeedai/DeepSpeed#4332",
        "huggingface/trl#2514",
        "deepspeedai/DeepSpeed#8148",
    ],
    "no-grad-element-0": [
        "huggingface/peft#1577",
        "huggingface/peft#2125",
        "huggingface/transformers#33930",
        "huggingface/peft#137",
        "huggingface/transformers#42489",
    ],
    "input-weight-not-parameter": ["huggingface/peft#1737", "huggingface/peft#1806"],
    # The Trainer's token count (a CPU tensor) gathered over a group with NCCL only (S8).
    "gather-cpu-tensor-over-nccl": ["huggingface/transformers#39896", "huggingface/transformers#38035"],
    # accelerate's refusal when a rank's 4-bit weights sit on another GPU than the one it trains on (a script that
    # loads before setting the device: every rank quantizes onto cuda:0); the peer waits in its first collective.
    "qlora-weights-on-another-device": ["huggingface/accelerate#1515", "artidoro/qlora#186"],
    # S7: what a user sees when the saved adapter is not the trained one (checks of scenarios/kit/saving.py).
    "saved_adapter_empty": ["huggingface/peft#970", "tloen/alpaca-lora#446"],
    "saved_adapter_zero_size": ["huggingface/peft#970"],
    "saved_adapter_untrained": ["huggingface/accelerate#4206"],
    "saved_adapter_values_differ": ["huggingface/accelerate#4206"],
    "saved_adapter_outputs_differ": [],
    # Any failed reload (no file, an unreadable header, a reload that raised): S7's SPEC names transformers#30491 for
    # the Trainer's SHARDED_STATE_DICT save that writes nothing, one cause among several.
    "saved_adapter_load_error": [],
    # torch >= 2.10's strict zip in LRScheduler: the Trainer's two param groups, DeepSpeed's one (empty no-decay group
    # dropped with LoRA); transformers#43711 builds the scheduler after accelerator.prepare.
    "zip-length-mismatch": ["huggingface/transformers#43692", "huggingface/transformers#43711"],
    # A job past its time limit (the launcher's name) where no rule places it; placed hangs are `timeout-in-<place>`.
    "timeout": ["huggingface/transformers#28791"],
    # S8's target: the hang reported at the first step's token-count gather.
    "timeout-in-token-count-gather": ["huggingface/transformers#28791", "huggingface/transformers#39896"],
    "fsdp-weights-on-another-device": ["huggingface/accelerate#1515"],
    "dora-init-reads-4bit-weight": [],
    "dora-output-dtype-upcast": ["huggingface/peft#1692"],
    "dora_layer_output_dtype": ["huggingface/peft#1692"],  # S5's check: fp32 leaves a DoRA layer
    # Found by this harness: peft >= 0.14 DoRA under FSDP1 with fp32 adapters gives bf16 grads to fp32 params.
    "optimizer-bf16-grad-on-fp32-param": ["huggingface/transformers#34702"],
    "fsdp-flatten-mixed-dtype": ["huggingface/peft#1737"],
    "fsdp-flatten-mixed-requires-grad": ["huggingface/peft#1737"],
    "dora-reads-sharded-lora-weight": ["huggingface/peft#1737"],
    "lora-update-scale": ["huggingface/peft#1893", "pytorch/pytorch#76464"],
    # S6's check: an adapter added to a compiled model saves under `_orig_mod.` keys and reloads as a no-op.
    "adapter_survives_reload": ["huggingface/peft#2957"],
    # S9, the training identities (scenarios/kit/identities.py): a run off its float64 hand reference, named by the
    # identity that broke. The one-batch update is not the token mean's (the Trainer's loss or its token count).
    "identity-batch": ["huggingface/transformers#46204"],
    # k accumulated micro-batches do not apply one batch's update.
    "identity-accumulation": [
        "huggingface/transformers#34191",
        "huggingface/transformers#35121",
        "huggingface/transformers#35651",
        "huggingface/transformers#46731",
    ],
    # 2 ranks do not apply the update of 1 rank on the same global batch.
    "identity-world-size": ["huggingface/transformers#34242", "huggingface/transformers#39392"],
    # a run stopped at a checkpoint and resumed in new processes does not end where the uninterrupted run ends.
    "identity-resume": [
        "huggingface/accelerate#4206",
        "huggingface/transformers#28320",
        "huggingface/transformers#31892",
    ],
    # the uninterrupted multi-step run itself is off its hand replay (not resume's failure).
    "identity-trajectory": [],
    # the merged model's outputs are not the adapter model's; unmerging does not give the base weights back.
    "identity-merge": [],
    "identity-unmerge": [],
    # S10: the adapter a fresh process loads is not the one saved: the file does not hold what was trained (a module
    # name that contains the adapter's name or "weight" rewritten, another adapter's tensors left out or written in),
    # the load leaves saved tensors out, or the merge of the loaded model is off.
    "roundtrip-save": ["huggingface/peft#2772", "huggingface/peft#3282", "huggingface/peft#3584"],
    "roundtrip-load": [
        "huggingface/peft#3433",
        "huggingface/peft#2289",
        "huggingface/peft#2252",
        "huggingface/peft#2038",
    ],
    "roundtrip-keys": ["huggingface/peft#3282"],
    "roundtrip-merge": ["huggingface/peft#2489"],
    "roundtrip-unmerge": [],
    # An adapter saved by a newer peft: its config names an option the older peft does not know. Before peft's
    # forward-compatible configs (PR #2038) that is this error; after it, a warning, and the option is dropped.
    "adapter-config-from-newer-peft": ["huggingface/peft#1650", "huggingface/peft#2038"],
    # A resume that raises reading the checkpoint's RNG state: not the silent failure, but no resume either.
    "resume-rng-state-unreadable": [],
}

#: What the upstream record (../shared/UPSTREAM.md) says changed a failure, to check a measured flip against:
#: signature -> (package, first release, source, direction): "appears" where that release brings the target
#: failure (the onset), "ends" where it removes it (the fix). A measured flip is compared only with the record
#: of its own direction: the release that fixed a failure says nothing about when it began. A failure that came and
#: went more than once upstream has a list of such records (UPSTREAM_HISTORY); a flip agrees with the one of its own
#: direction that names its package and release.
UPSTREAM_CHANGES: dict[str, tuple[str, str, str, str]] = {
    # S1's target needs DoRA to run under FSDP at all: peft#1737 (fixed by PR #1806) first released in 0.12.0;
    # before it DoRA under FSDP fails in other ways.
    "checkpoint-recompute-dtype": (
        "peft",
        "0.12.0",
        "peft#1737 (DoRA under FSDP) fixed by PR #1806, first released in 0.12.0; earlier releases fail otherwise",
        "appears",
    ),
    "checkpoint-recompute-shape[0]": (
        "deepspeed",
        "0.19.3",
        "DeepSpeed PR #8148 (Z3 activation checkpointing with frozen params), first released in 0.19.3",
        "ends",
    ),
    "gather-cpu-tensor-over-nccl": (
        "transformers",
        "4.57.0",
        "transformers PR #40773 (fixes #39896) moves num_items_in_batch to the device before gathering, in 4.57.0",
        "ends",
    ),
    "no-grad-element-0": (
        "transformers",
        "5.0.0",
        "transformers#43203 made non-reentrant checkpointing the default, shipped in 5.0.0",
        "ends",
    ),
}


#: Failures whose upstream history has several changes (S9's identities: transformers' token counting moved
#: several times), oldest first. Sources: the threads and the wheels of each release, read 2026-11-27.
#: A record about one feature of a config (S10's) carries its trigger, the one table of which config each record
#: speaks for: `key=value` (the config's value), `key~word` (a value under the key, or the key's text, contains the
#: word; `names.extra` reads one name), `key#n` (at least n of them); alternatives joined by `|`. A record with a
#: trigger is cited only for a flip of a config that holds it.
UPSTREAM_HISTORY: dict[str, list[tuple[str, ...]]] = {
    # S10, each record naming the feature it is about (the grid and the S10 rows are per config).
    "roundtrip-save": [
        (
            "peft",
            "0.18.0",
            "peft PR #2773 (issue #2772): module names that contain 'weight' or the adapter's name are "
            "no longer rewritten in the saved keys",
            "ends",
            "names~weight|names~default",
        ),
        (
            "peft",
            "0.20.0",
            "peft's fix of #3282 selects an adapter's tensors by path segments: another adapter named "
            "like a module segment ('q') now leaves that module's tensors out (#3584, open)",
            "appears",
            "adapters~q",
        ),
    ],
    "roundtrip-keys": [
        (
            "peft",
            "0.20.0",
            "peft#3282: saving adapter 'a' no longer writes in the tensors of adapter 'a_b'",
            "ends",
            "adapters#2",
        ),
        (
            "peft",
            "0.21.0",
            "peft PR #3490 (issue #3433), its save side: the state dict of a modules_to_save module named with the "
            "method prefix ('lora_head') no longer over-selects keys the load cannot place (the save-side cause PR "
            "#3474 named)",
            "ends",
            "names.extra~lora_|heads~lora_",
        ),
    ],
    "roundtrip-load": [
        (
            "peft",
            "0.15.0",
            "peft PR #2038 (configs made forward compatible): an older peft drops the options it does not know, "
            "with a warning, and loads the rest, which 'could lead to wrong results'; trainable tokens are new in "
            "0.15.0, so a 0.15.0 trainable-tokens adapter loads on 0.14.0 without its tokens",
            "ends",
            "trainable_tokens=True",
        ),
        (
            "peft",
            "0.15.0",
            "peft PR #2334 (issue #2289): a modules_to_save head is matched to its saved name anchored and in a fixed "
            "order, no longer by the first name it starts with in the process's string-hash order",
            "ends",
            "heads#2",
        ),
        (
            "peft",
            "0.18.0",
            "peft PR #2773 (issue #2772): a LoRA target whose name contains 'weight' or the adapter's name is saved "
            "and loaded under its own name",
            "ends",
            "names~weight|names~default",
        ),
        (
            "peft",
            "0.21.0",
            "peft PR #3490 (issue #3433): a modules_to_save module whose name holds the method prefix "
            "('lora_head') is restored on load",
            "ends",
            "names.extra~lora_|heads~lora_",
        ),
    ],
    "roundtrip-merge": [
        (
            "peft",
            "0.16.0",
            "peft#2489: merging a lora_bias adapter scales its bias by the adapter's scaling",
            "ends",
            "lora_bias=True",
        ),
    ],
    "identity-accumulation": [
        (
            "transformers",
            "4.46.0",
            "transformers PR #34191 (Fix Gradient Accumulation issue): num_items_in_batch",
            "ends",
        ),
        (
            "transformers",
            "4.47.0",
            "transformers PR #34915 inverted model_accepts_loss_kwargs in training_step",
            "appears",
        ),
        ("transformers", "4.47.1", "transformers PR #35121 (Fix GA loss bugs and add unit test)", "ends"),
        (
            "transformers",
            "4.48.0",
            "transformers PR #35438 brought the inverted condition back (#35663, #35787)",
            "appears",
        ),
        (
            "transformers",
            "4.48.1",
            "transformers PR #35651 (Fix condition when GA loss bug fix is not performed)",
            "ends",
        ),
        (
            "transformers",
            "5.15.0",
            "transformers PR #47261 (issue #46731): the LabelSmoother takes num_items_in_batch",
            "ends",
        ),
    ],
    "identity-batch": [
        (
            "transformers",
            "4.47.0",
            "transformers PR #34915 inverted model_accepts_loss_kwargs: num_items_in_batch no longer reaches the loss",
            "ends",
        ),
        (
            "transformers",
            "4.48.0",
            "transformers PR #35438 brought the inverted condition back (#35663, #35787)",
            "ends",
        ),
        (
            "transformers",
            "4.47.1",
            "transformers PR #35121 (Fix GA loss bugs) passes num_items_in_batch again after 4.47.0's inverted check",
            "appears",
        ),
        (
            "transformers",
            "4.46.0",
            "transformers PR #34191: num_items_in_batch counts labels before the causal shift",
            "appears",
        ),
        (
            "transformers",
            "4.48.1",
            "transformers PR #35651 (Fix condition when GA loss bug fix is not performed): the count reaches the loss",
            "appears",
        ),
        (
            "transformers",
            "5.10.1",
            "transformers PR #46204 (Fix num_items_in_batch over-counting for causal LM losses)",
            "ends",
        ),
    ],
    "identity-world-size": [
        (
            "transformers",
            "4.54.0",
            "transformers PR #39395 (issue #39392): average_tokens_across_devices on by default",
            "ends",
        ),
    ],
    "identity-resume": [
        ("accelerate", "1.15.0", "accelerate#4206: FSDP2 FULL_STATE_DICT kept only rank 0's adapter shard", "ends"),
    ],
}


#: Records an earlier version of a scenario failed with a name that today's scenario counts as its identity holding:
#: S9's accumulation and world-size jobs once failed `check-identity-batch` where their two legs agreed and both were
#: off the reference (the one-batch loss, S9-identity-batch-loss's failure); today the identity holds there. Such a
#: record is judged a pass when the table is made, its own report kept.
HOLDS_IN_TODAYS_SCENARIO = {
    "S9-identity-grad-accumulation": "check-identity-batch",
    "S9-identity-world-size": "check-identity-batch",
}


def family(signature: str | None) -> str:
    """A failure's family: 'checkpoint-recompute-dtype[float32->bfloat16]' -> 'checkpoint-recompute-dtype'."""
    return (signature or "").split("[")[0]


def upstream_change(
    signature: str | None,
    newer_state: str,
    measured: tuple[str | None, str | None] = (None, None),
    configs: list[dict[str, Any]] | None = None,
) -> dict[str, str] | None:
    """The upstream record for a measured flip of `signature` (its family, e.g. 'checkpoint-recompute-dtype',
    where the exact name has none) in the flip's direction, or None. Where several records of that direction exist
    (UPSTREAM_HISTORY), the one naming the `measured` (package, release), else the first. A record about a feature
    (its trigger) is a candidate only where one of the flip's `configs` holds it: never cited by a flip of another
    feature, nor where the configs are not known."""
    family_name = family(signature).removeprefix("check-")  # a check's record is filed under its name (S9's)
    direction = "appears" if newer_state == "target" else "ends"
    known = UPSTREAM_CHANGES.get(signature or "") or UPSTREAM_CHANGES.get(family_name)
    history = UPSTREAM_HISTORY.get(signature or "") or UPSTREAM_HISTORY.get(family_name) or ([known] if known else [])
    mine = [k for k in history if k[3] == direction and _triggered(k, configs)]
    if not mine:
        return None
    chosen = next((k for k in mine if (k[0], k[1]) == measured), None) or _nearest(mine, measured) or mine[0]
    return {"package": chosen[0], "release": chosen[1], "source": chosen[2], "direction": direction}


def _triggered(record: tuple[str, ...], configs: list[dict[str, Any]] | None) -> bool:
    if len(record) < 5:
        return True
    return bool(configs) and any(trigger_holds(record[4], config) for config in configs or [])


def trigger_holds(trigger: str, config: dict[str, Any]) -> bool:
    """Whether a config holds a record's trigger (see UPSTREAM_HISTORY): any of its `|` alternatives."""
    for alternative in trigger.split("|"):
        match = re.match(r"^([\w.]+)([=~#])(.+)$", alternative)
        if match is None:
            continue
        path, op, want = match.groups()
        value: Any = config
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            continue
        values = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        if op == "=" and str(value) == want:
            return True
        if op == "~" and any(want in str(v) for v in values):
            return True
        if op == "#" and isinstance(value, list | dict) and len(value) >= int(want):
            return True
    return False


def upstream_packages(signature: str | None) -> set[str]:
    """The packages the upstream record names for a failure (any direction): where a release of one can change it,
    so two install days that agree are still swept over that package's releases between them."""
    family_name = family(signature).removeprefix("check-")
    known = UPSTREAM_CHANGES.get(signature or "") or UPSTREAM_CHANGES.get(family_name)
    history = UPSTREAM_HISTORY.get(signature or "") or UPSTREAM_HISTORY.get(family_name) or ([known] if known else [])
    return {entry[0] for entry in history}


def _nearest(
    records: list[tuple[str, str, str, str]], measured: tuple[str | None, str | None]
) -> tuple[str, str, str, str] | None:
    """Of the records naming the measured package, the newest release at or before the measured one (the record a
    measured release is to be compared with where none names it exactly), or None."""
    package, release = measured
    if not package or not release:
        return None

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", version)[:3])

    before = [k for k in records if k[0] == package and key(k[1]) <= key(release)]
    return max(before, key=lambda k: key(k[1])) if before else None


_METADATA = re.compile(r"saved metadata: \{(?P<saved>[^}]*)\}\s*recomputed metadata: \{(?P<recomputed>[^}]*)\}", re.S)
_SHAPE = re.compile(r"'shape': torch\.Size\(\[(?P<dims>[^\]]*)\]\)")
_DTYPE = re.compile(r"'dtype': torch\.(?P<dtype>\w+)")


def upstream(signature: str | None, configs: list[dict[str, Any]] | None = None) -> list[str]:
    """Upstream references for a name (a `checkpoint-recompute-dtype[...]` name by its family). Where its history
    has records about features (S10's triggers) and the configs are given, only the threads the records their configs
    hold name: a target named 'weight' cites peft#2772, never the multi-head thread."""
    if not signature:
        return []
    family = signature.split("[")[0] if signature.startswith("checkpoint-recompute-dtype") else signature
    known = list(KNOWN_ISSUES.get(family) or KNOWN_ISSUES.get(family.removeprefix("check-"), []))
    history = UPSTREAM_HISTORY.get(family.removeprefix("check-")) or []
    if configs is None or not any(len(record) > 4 for record in history):
        return known
    named = {n for record in history if _triggered(record, configs) for n in re.findall(r"#(\d+)", record[2])}
    return [issue for issue in known if issue.rpartition("#")[2] in named]


#: Failures that say the stack's packages cannot run over the torch they were given at all (the era stack of an
#: old day over a GPU node's fixed torch): the environment is broken, whatever the scenario was about to test.
CANNOT_RUN_OVER_TORCH = frozenset({"bnb-no-library-for-this-cuda", "bnb-needs-triton-ops"})
#: ... or on this machine at all (deepspeed before 0.14 has no CPU accelerator without intel_extension_for_pytorch):
#: whatever a scenario would test there, the stack cannot start.
CANNOT_RUN_HERE = CANNOT_RUN_OVER_TORCH | {"deepspeed-cpu-needs-ipex", "native-library-cannot-load"}

#: A native library or extension that cannot load on this machine: a system library too old (Debian 12's libstdc++
#: stops at GLIBCXX_3.4.30; a wheel built against 3.4.32 refuses it), missing, or built for another ABI. The machine's
#: limit, never the stack's failure.
NATIVE_LOAD = re.compile(
    r"version [`'](?P<needs>GLIBC(?:XX)?_[\d.]+|CXXABI_[\d.]+)' not found"
    r"|(?P<missing>[\w.+-]+\.so[\w.]*): cannot open shared object file"
    r"|wrong ELF class|invalid ELF header"
)


@dataclass(frozen=True)
class Rule:
    """One known failure's wording: it matches where the exception type is one of `types` (any where empty), every
    text of `message` is in the message (or the `pattern` matches it), every text of `traceback` is in the
    traceback, and `when` (the few wordings that need more than that) holds. `name` is the failure's name, or a
    function of the message and traceback for the ones named by what they say."""

    name: str | Callable[[str, str], str]
    message: tuple[str, ...] = ()
    pattern: str | None = None
    traceback: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    when: Callable[[str, str, str], bool] | None = None
    why: str = ""

    def matches(self, short: str, message: str, traceback: str) -> bool:
        if self.types and short not in self.types:
            return False
        if not all(text in message for text in self.message):
            return False
        if self.pattern is not None and not re.search(self.pattern, message):
            return False
        if not all(text in traceback for text in self.traceback):
            return False
        return self.when is None or self.when(short, message, traceback)


def _any_in(*texts: str) -> Callable[[str, str, str], bool]:
    """A rule's `when`: one of `texts` is in the message."""
    return lambda short, message, traceback: any(text in message for text in texts)


def _freed_embedding(short: str, message: str, traceback: str) -> bool:
    freed = "its data is not allocated yet" in message or ("setStorage:" in message and "storage of size 0" in message)
    # With use_orig_params=True the same never-unsharded weight is FSDP1's size-0 placeholder, and the embedding
    # refuses its shape instead; ZeRO-3 words an ungathered weight the same way, but through deepspeed's hooks.
    placeholder = short == "RuntimeError" and "'weight' must be 2-D" in message and "deepspeed" not in traceback
    return (freed or placeholder) and "embed_tokens" in traceback


#: Every known failure's wording, first match wins (the order matters where wordings overlap).
RULES: tuple[Rule, ...] = (
    Rule("bnb-no-library-for-this-cuda", ("CUDA Setup failed despite GPU being available",),
         why="bitsandbytes < 0.43 ships no library for torch's CUDA (13.0)"),
    Rule("bnb-no-library-for-this-cuda",
         when=lambda s, m, t: "Configured CUDA binary not found at" in m + t and "libbitsandbytes_cuda" in m + t,
         why="bitsandbytes 0.46-0.47: no libbitsandbytes_cuda130.so to call"),
    Rule("bnb-no-library-for-this-cuda", ("Forgot to compile the bitsandbytes library",),
         why="bitsandbytes >= 0.46's banner when its native library is missing"),
    Rule("bnb-no-library-for-this-cuda", pattern=r"libbitsandbytes_cpu\.\w+: undefined symbol: c\w*quantize",
         why="bitsandbytes 0.45 fell back to its CPU library for CUDA tensors"),
    Rule("native-library-cannot-load", types=("OSError", "ImportError", "RuntimeError"),
         when=lambda s, m, t: bool(NATIVE_LOAD.search(m))),
    Rule("deepspeed-cpu-needs-ipex", ("CPU_Accelerator requires intel_extension_for_pytorch",),
         why="deepspeed < 0.14 on a machine without CUDA: no accelerator to import"),
    Rule("resume-rng-state-unreadable", ("don't know how to restore data location of torch.storage.UntypedStorage",),
         why="the Trainer's resume reading its checkpoint's RNG state (rng_state_<rank>.pth) with a torch that cannot "
             "map the saved location back (S9 resume on transformers 4.40-4.45 over torch 2.3 and later)"),
    Rule("adapter-config-from-newer-peft",
         pattern=r"(Lora|Peft)Config\.__init__\(\) got an unexpected keyword argument",
         why="an adapter saved by a newer peft, loaded by an older one: its adapter_config.json names a field the "
             "older LoraConfig does not have (peft filters unknown fields with a warning only from later releases)"),
    Rule("bnb-needs-triton-ops", ("No module named 'triton.ops'",),
         why="bitsandbytes 0.43 imports triton.ops, which triton 3.2 (torch 2.6) removed"),
    Rule(lambda m, t: _checkpoint_signature(m),
         when=lambda s, m, t: "different metadata than during the forward pass" in m or s == "CheckpointError"),
    Rule("gather-cpu-tensor-over-nccl",
         when=lambda s, m, t: ("Tensors must be CUDA and dense" in m or "No backend type associated with device type "
                               "cpu" in m) and ("_get_num_items_in_batch" in t or "gather" in t),
         why="transformers#39896: the Trainer's token count, over NCCL alone"),
    Rule("qlora-weights-on-another-device",
         ("loaded in 8-bit or 4-bit precision on a different device than the one you're training on",)),
    Rule("fsdp-weights-on-another-device", ("Inconsistent compute device and `device_id` on rank",),
         why="the same misplacement refused by torch's FSDP1 instead of accelerate: a rank's weights (loaded before "
             "any device was set) sit on cuda:0 while the rank wraps for its own GPU (S8 on 2026-04-15, 2 x H200)"),
    Rule("dora-init-reads-4bit-weight", traceback=("peft/tuners/lora/dora.py", "bitsandbytes"),
         when=_any_in("invalid argument to getCurrentStream", "variable.set_data(tensor)"),
         why="DoRA's magnitude init reads a rank's 4-bit base weight and fails, rank 0 dequantizing it and rank 1 "
             "copying it (S8 on 2025-11-14, deepspeed.init_distributed first, 2 x H200): one failure, two wordings"),
    Rule("no-grad-element-0", ("element 0 of tensors does not require grad",)),
    Rule("input-weight-not-parameter", when=_any_in("Input weight should be of type nn.Parameter",
                                                    "should be of type nn.Parameter")),
    Rule("fsdp-flatten-mixed-dtype", ("Must flatten tensors with uniform dtype",)),
    Rule("fsdp-flatten-mixed-requires-grad", ("Must flatten tensors with uniform `requires_grad`",)),
    Rule("zero3-allgather-mixed-dtype", when=_any_in("ProcessGroupGloo::allgather: invalid tensor type",
                                                     "output tensor must have the same type as input tensor"),
         why="deepspeed 0.19.2: fp32 adapters next to bf16 persistent params (the second wording through NCCL)"),
    Rule("bnb-cpu-4bit-uint8-storage-only", ("Blockwise 4bit dequantization on CPU only supports uint8 storage",),
         why="bitsandbytes 0.46 on CPU: bf16 quant_storage cannot dequantize"),
    Rule("deepspeed-cpu-needs-numactl", ("No such file or directory: 'numactl'",),
         why="DeepSpeed's CPU accelerator binds cores with the numactl binary"),
    Rule("zip-length-mismatch", ("zip() argument 2 is longer than argument 1",),
         why="transformers 4.41 Trainer + deepspeed 0.19 + torch 2.13 scheduler step"),
    Rule("optimizer-bf16-grad-on-fp32-param",
         when=_any_in("expected dtype float for `end` but got dtype c10::BFloat16",
                      "Tensors of the same index must be on the same device and the same dtype")),
    Rule("matmul-dtype-mismatch", pattern=r"expected (m1 and m2|mat1 and mat2) to have the same dtype",
         why="CPU and CUDA wordings"),
    Rule("dora-unsupported-on-quantized-layer", ("does not support DoRA yet",),
         why="peft 0.9 refuses DoRA on bnb Linear4bit/Linear8bitLt"),
    Rule("dora-reads-sharded-lora-weight", types=("IndexError",), traceback=("dora.py", "lora_A.weight.shape"),
         why="DoRA reads lora_A.weight outside lora_A's FSDP unit; with use_orig_params it is a flat 1-D shard"),
    Rule(lambda m, t: "dora-mixed-tensor-dtensor" if "dora" in t.lower() else "fsdp2-mixed-tensor-dtensor",
         ("got mixed torch.Tensor and DTensor",),
         why="FSDP2 shards parameters as DTensors; DoRA adds a plain tensor (its weight norm, or an unsharded lora "
             "weight) to a DTensor"),
    Rule("fsdp2-mixed-param-dtype", ("FSDP expects uniform original parameter dtype",),
         why="fully_shard groups need one dtype (fp32 adapters beside a bf16 base)"),
    Rule("deepspeed-allgather-inplace-view", ("is a view and is being modified inplace",), traceback=("deepspeed",),
         why="deepspeed's all_gather writes into a view of a split"),
    Rule("bnb-quant-state-lost", ("object has no attribute 'quant_state'",),
         why="a Params4bit replaced by a plain tensor (FSDP flattening) lost its state"),
    Rule("dora-reads-sharded-lora-weight", ("Expected all tensors to be on the same device",),
         traceback=("lora_A(x_eye)",),
         why="the same read on GPUs: x_eye is made on lora_A.weight's device, read outside lora_A's FSDP1 unit, where "
             "it is not the unit's CUDA weight (S7's DoRA config on two GPUs, peft 0.18 and 0.21)"),
    Rule("dora-reads-sharded-lora-weight", ("size mismatch, got input",), when=lambda s, m, t: "dora" in t.lower(),
         why="the same sharded read as the IndexError above, through addmv"),
    Rule("trainer-bf16-needs-gpu", ("Your setup doesn't support bf16/gpu",)),
    Rule("fsdp2-needs-cuda-streams", when=_any_in("FSDP requires CUDA for streams",
                                                  "'Stream' object has no attribute 'record_event'")),
    Rule("needs-cuda", when=_any_in("CUDA driver version is insufficient", "Torch not compiled with CUDA enabled")),
    Rule("bnb-4bit-assert", types=("AssertionError",),
         when=lambda s, m, t: not m.strip() and innermost_in(t, "bitsandbytes"),
         why="bitsandbytes' own bare assert (no quant_state: nothing was quantized)"),
    Rule("numpy-long-removed", ("module 'numpy' has no attribute 'long'",),
         why="numpy removed the np.long alias in 1.24 (and brought it back in 2.0): a package on the import path (here "
             "transformers.trainer's, with deepspeed 0.14 and numpy 1.26) still uses it"),
    Rule("trainer-fsdp-config-bool-into-environ", ("str expected, not bool",), traceback=("training_args.py",),
         types=("TypeError",),
         why="transformers 4.38 copies fsdp_config values into os.environ unconverted: a bool (use_orig_params=False, "
             "as the config's JSON form allows) cannot be an environment variable"),
    Rule("recompute-uses-freed-fsdp-param", ("setStorage:", "storage of size 0"), traceback=("checkpoint",),
         why="recomputation in backward touches a parameter FSDP has already freed (resharded) after forward"),
    Rule("forward-reads-freed-fsdp-param", when=_freed_embedding,
         why="the first forward reads the embedding's weight, an FSDP1 flat-parameter view whose storage is freed (no "
             "unshard ran for it): transformers 4.53 / accelerate 1.8 through the Trainer over torch 2.11 (S8 on "
             "2025-07-04, 2 x H200, every bf16 config, each job in processes of its own: run 5598); three wordings"),
)  # fmt: skip


def name(exc_type: str, message: str, traceback: str = "") -> str | None:
    """The name of a known failure of the stack (the first rule of RULES that matches), or None (the harness then
    names it unclassified)."""
    short = exc_type.rsplit(".", 1)[-1]
    for rule in RULES:
        if rule.matches(short, message, traceback):
            return rule.name(message, traceback) if callable(rule.name) else rule.name
    return None


#: Where a hung job's ranks wait, from their Python stacks (first match wins): a timeout is named by its place, so
#: that one count never mixes hangs of different mechanisms. A hang no rule places stays `timeout`.
HANG_PLACES: tuple[tuple[str, str], ...] = (
    # The Trainer's first-step token count gathered over every rank (average_tokens_across_devices): the hang
    # reported with a script's own init_process_group("nccl") (S8's target).
    ("_get_num_items_in_batch", "token-count-gather"),
    # Creating the process group itself (deepspeed.init_distributed, init_process_group): no collective yet.
    ("_new_process_group_helper", "process-group-init"),
    # Wrapping: rank 0's weights broadcast to the others (FSDP1 sync_module_states, FSDP2 full-state-dict load).
    ("_sync_module_params_and_buffers", "wrap-weight-broadcast"),
    ("fsdp2_load_full_state_dict", "wrap-weight-broadcast"),
)


def hang_place(rank_stacks: object) -> str | None:
    """The place every stack that says anything agrees on (the job's own thread of each rank), or None."""
    stacks = rank_stacks.values() if isinstance(rank_stacks, dict) else [rank_stacks]
    places = set()
    for text in stacks:
        current = str(text or "").split("Current thread", 1)[-1]
        found = next((place for frame, place in HANG_PLACES if f" in {frame}" in current), None)
        if current.strip():
            places.add(found)
    return places.pop() if len(places) == 1 else None


def innermost_in(traceback: str, package: str) -> bool:
    """Whether the innermost frame of a traceback is inside `package` (the failure is that library's own)."""
    frames = re.findall(r'File "([^"]+)"', traceback)
    return bool(frames) and f"/{package}/" in frames[-1]


def _checkpoint_signature(message: str) -> str:
    pairs = _METADATA.findall(message)
    if not pairs:
        return "checkpoint-recompute-other"
    for _saved, recomputed in pairs:
        shape = _SHAPE.search(recomputed)
        if shape and shape.group("dims").strip() == "0":
            return "checkpoint-recompute-shape[0]"
    dtype_changes = []
    for saved, recomputed in pairs:
        a, b = _DTYPE.search(saved), _DTYPE.search(recomputed)
        if a and b and a.group("dtype") != b.group("dtype"):
            change = f"{a.group('dtype')}->{b.group('dtype')}"
            if change not in dtype_changes:
                dtype_changes.append(change)
    if dtype_changes:
        return f"checkpoint-recompute-dtype[{','.join(sorted(dtype_changes))}]"
    return "checkpoint-recompute-shape"
