"""Adapters carried across releases, for reading (issue 60): the newest `results/adapter-grid/<run>/` as one grid per
feature (saved on x loaded on, the discrepancy in each cell) and the grid's flips, per feature and per direction.

A flip is two neighbouring measured cells of one row (the same saved adapter loaded on two consecutive days: the load
side changed) or of one column (adapters saved on two consecutive days, loaded on the same day: the save side changed)
whose outcomes differ; it names the releases that differ between those two days, and claims no more: the days differ
by several releases until a sweep names one. A cell no record holds is "not measured", never inferred.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.knowledge.store import Store
from harness.recording.flip import Flip

SCENARIO = "S10-adapter-roundtrip"
OUTPUT = "ADAPTER-GRID.md"


def grouped(found: list[Flip]) -> list[Flip]:
    """The grid's flips with their fixed days together (a load-side flip of one feature for every adapter it holds
    for; a save-side one for every load day), in the order first met."""
    merged: dict[str, Flip] = {}
    for flip in found:
        if flip.grid_key in merged:
            merged[flip.grid_key].fixed_days = sorted({*merged[flip.grid_key].fixed_days, *flip.fixed_days})
        else:
            merged[flip.grid_key] = replace(flip, fixed_days=sorted(flip.fixed_days))
    return list(merged.values())


def grid_fields(flip: Flip) -> dict[str, Any]:
    """A grouped grid flip as sweep.json keeps it (feature, direction, the days and outcomes, the fixed days)."""
    return {"feature": flip.feature, "direction": flip.side, "before_day": flip.older, "after_day": flip.newer,
            "before": flip.older_state, "after": flip.newer_state, "fixed_days": list(flip.fixed_days)}  # fmt: skip


def order(meta: dict[str, Any]) -> list[str]:
    """The run's days, oldest first (the profile's order; by name for a run that did not record it)."""
    return list(meta.get("order") or sorted(meta["days"]))


def features(meta: dict[str, Any]) -> list[str]:
    """The run's features in the scenario's order (by id for a run that did not record it)."""
    return list(meta.get("features") or meta["configs"])


def state(pair: dict[str, Any]) -> str:
    """A cell's outcome as the flips compare it: "pass", or the failure's signature."""
    return "pass" if pair["outcome"] == "pass" else str(pair.get("signature") or pair["outcome"])


def flips(meta: dict[str, Any], pairs: list[dict[str, Any]]) -> list[Flip]:
    days = order(meta)
    cell = {(p["config_id"], p["saved_on"], p["loaded_on"]): p for p in pairs}
    found = []
    for feature in features(meta):
        for fixed in days:
            row = [(d, cell.get((feature, fixed, d))) for d in days]
            column = [(d, cell.get((feature, d, fixed))) for d in days]
            for direction, line in (("load", row), ("save", column)):
                # an error (an adapter config a release cannot read) says nothing of the round trip: not evidence
                measured = [(d, p) for d, p in line if p is not None and p["outcome"] in ("pass", "fail")]
                for (a_day, a), (b_day, b) in itertools.pairwise(measured):
                    if state(a) != state(b):
                        found.append(Flip(a_day, b_day, state(a), state(b),
                                          _changed(meta["days"][a_day], meta["days"][b_day]), scenario=SCENARIO,
                                          config_ids=[feature], side=direction, fixed_days=[fixed]))  # fmt: skip
    return found


def _changed(before: dict[str, str], after: dict[str, str]) -> dict[str, list[Any]]:
    names = [*AXIS_PACKAGES, "safetensors"]
    return {p: [before.get(p), after.get(p)] for p in names if before.get(p) != after.get(p)}


def feature_words(config: dict[str, Any], seed: dict[str, Any]) -> str:
    """What sets a seed config apart from the seed ("DoRA", "a modules_to_save head named lora_head", ...)."""
    parts = []
    if config.get("model") == "llama":
        parts.append("the tiny Llama")
    if config.get("adapter") == "dora":
        parts.append("DoRA")
    if config.get("targets") != seed.get("targets"):
        parts.append({"regex": "regex targets", "all-linear": "all-linear targets"}.get(config["targets"], ""))
    for key, words in (("embed", "LoRA on the embedding"), ("head", "LoRA on the output layer"),
                       ("modules_to_save", "a modules_to_save head"), ("trainable_tokens", "trainable tokens"),
                       ("lora_bias", "lora_bias"), ("rslora", "rsLoRA")):  # fmt: skip
        if config.get(key) and not seed.get(key):
            parts.append(words)
    if config.get("patterns") not in (None, "none"):
        parts.append(f"{config['patterns']} pattern")
    if config.get("adapters") != seed.get("adapters"):
        parts.append("adapters " + " and ".join(config["adapters"]))
    renamed = {k: v for k, v in (config.get("names") or {}).items() if (seed.get("names") or {}).get(k) != v}
    if renamed and config.get("model") != "llama":
        parts += names_words(config, renamed)
        if any(p.startswith("a modules_to_save head named") for p in parts):
            parts.remove("a modules_to_save head")
    return ", ".join(p for p in parts if p) or "LoRA on q and v (the seed)"


def names_words(config: dict[str, Any], renamed: dict[str, str]) -> list[str]:
    """Renamed modules by what the config does with them: a LoRA target, the modules_to_save head, or a layer no
    adapter touches (a name on a module peft never adapts cannot be what a flip of the file's keys is about)."""
    adapted = {"q", "v", *(["embed"] if config.get("embed") else []), *(["head"] if config.get("head") else [])}
    roles: dict[str, list[str]] = {}
    for slot, name in sorted(renamed.items(), key=lambda item: item[1]):
        if slot in adapted:
            roles.setdefault("LoRA targets named", []).append(name)
        elif slot == "extra" and config.get("modules_to_save"):
            roles.setdefault("a modules_to_save head named", []).append(name)
        else:
            roles.setdefault("layers named", []).append(name)
    words = {"LoRA targets named": "a LoRA target named", "layers named": "a layer named"}
    return [
        f"{words.get(role, role) if len(names) == 1 else role} {' and '.join(names)}"
        + (" (not adapted)" if role == "layers named" else "")
        for role, names in roles.items()
    ]


def document(store: Store) -> dict[str, Any] | None:
    """The newest finished run as the page and ADAPTER-GRID.md show it: per feature, its grid's cells in words, the
    errors named, and the flips."""
    run = store.newest_adapter_grid
    if run is None:
        return None
    meta, pairs, saves = run.meta, run.pairs, run.saves
    days = order(meta)
    seed = meta["configs"][meta.get("seed") or features(meta)[0]]
    cell = {(p["config_id"], p["saved_on"], p["loaded_on"]): p for p in pairs}
    saved = {(s["config_id"], s["day"]): s for s in saves}
    found = flips(meta, pairs)
    swept = run.sweep
    label = {d: f"{d.split('date-')[-1]} (peft {meta['days'][d].get('peft', '?')})" for d in days}
    shown = []
    for feature in features(meta):
        config = meta["configs"][feature]
        errors: dict[str, str] = {}
        rows = [{"saved_on": label[s], "cells": [_cell(cell.get((feature, s, d)), saved.get((feature, s)), errors)
                                                 for d in days]} for s in days]  # fmt: skip
        shown.append({
            "id": feature,
            "words": feature_words(config, seed),
            "rows": rows,
            "errors": [f"E {sig}: {example}" for sig, example in sorted(errors.items())],
            "flips": _flip_lines([f for f in found if f.feature == feature], label, swept, config),
        })  # fmt: skip
    return {"run": run.folder.name, "loads": len(pairs), "saves": len(saves), "days": [label[d] for d in days],
            "columns": [d.split("date-")[-1][2:] for d in days], "features": shown}  # fmt: skip


def render(store: Store) -> str | None:
    """ADAPTER-GRID.md's text from the newest finished run, or None where there is none."""
    found = document(store)
    if found is None:
        return None
    lines = [
        "# Adapters carried across releases (S10)",
        "",
        f"From run `{found['run']}` ({found['loads']} loads of {found['saves']} saves over {len(found['days'])} atlas "
        "days). Each S10 adapter (its seed configs, and the drawn configs that failed on some atlas day) is saved on a "
        "day (`save_pretrained` in that day's environment) and loaded on every later day and on the day before "
        "(`PeftModel.from_pretrained`, then `load_adapter`; one with several modules_to_save heads under each of four "
        "fixed hash seeds, the first failure shown), each load judged "
        "on its load day against the base with the saved file's tensors applied by the formulas in float64. A cell: "
        "`✓` holds (at the round-off floor); `✗ load 0.97x` the leg that failed (save, load, keys, merge, unmerge) and "
        "how far off it is, of the adapter's effect on the logits; `E` an error (named below the grid); `n/a` the "
        "feature does not exist on the saving day's peft; blank: not measured. Rows: saved on; columns: loaded on.",
        "",
    ]
    for feature in found["features"]:
        lines += [f"## {feature['words']} (`{feature['id']}`)", ""]
        lines.append("| saved on \\ loaded on | " + " | ".join(found["columns"]) + " |")
        lines.append("|---|" + "---|" * len(found["columns"]))
        lines += [f"| {row['saved_on']} | " + " | ".join(row["cells"]) + " |" for row in feature["rows"]]
        lines.append("")
        lines += [f"- `{e}`" for e in feature["errors"]]
        lines += feature["flips"]
        lines.append("")
    return "\n".join(lines) + "\n"


def _cell(pair: dict[str, Any] | None, save: dict[str, Any] | None, errors: dict[str, str]) -> str:
    if save is not None and save.get("outcome") == "not-applicable":
        return "n/a"
    if pair is None:
        return ""
    if pair["outcome"] == "pass":
        return "✓"
    if pair["outcome"] == "fail":
        leg = str(pair.get("check", "")).removeprefix("roundtrip-")
        off = (pair.get("metrics") or {}).get("off_by")
        return f"✗ {leg}" + (f" {off:.2g}x" if isinstance(off, int | float) else "")
    errors.setdefault(str(pair.get("signature")), str(pair.get("message", ""))[:160].replace("|", "/"))
    return "E"


def _flip_lines(
    mine: list[Flip],
    short: dict[str, str],
    swept: dict[str, dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
) -> list[str]:
    if not mine:
        return ["No flip: every row and every column measured holds one outcome."]
    swept = swept or {}
    together = sorted(grouped(mine), key=lambda g: (g.side or "", g.older, g.newer, g.older_state, g.newer_state))
    if any(g.grid_key in swept for g in together):
        out = ["Flips (each between two measured neighbours, then named at release resolution: each package that "
               "differs moved alone over the older day's stack, and the releases of the one that reproduces the flip "
               "swept, `adapters-grid --sweep`):"]  # fmt: skip
    else:
        out = ["Flips (each between two measured neighbours; the releases that differ between the two days are "
               "named, not yet which of them):"]  # fmt: skip
    for flip in together:
        a, b = flip.older, flip.newer
        what = f"{flip.older_state} → {flip.newer_state}"
        days = ", ".join(short[d].split(" ")[0] for d in flip.fixed_days)
        entry = swept.get(flip.grid_key)
        changed = "; ".join(flip.changed_words()) or "no package differs"
        where = sweep_words(entry, flip.older_state, flip.newer_state, config) if entry else f"({changed})"
        if flip.side == "load":
            out.append(f"- loaded on {short[b]} instead of {short[a]}: {what}, for adapters saved on {days}: {where}")
        else:
            out.append(f"- saved on {short[b]} instead of {short[a]}: {what}, when loaded on {days}: {where}")
    return out


def sweep_words(entry: dict[str, Any], before: str, after: str, config: dict[str, Any] | None = None) -> str:
    """What the sweep measured for one flip, in a sentence: the release and the upstream record, or why none."""
    moves = entry.get("moves") or {}
    moved = ", ".join(f"{p} {s}" for p, s in moves.items())
    reproducing = entry.get("reproducing") or []
    if len(reproducing) != 1:
        why = "no package moved alone gives it" if not reproducing else f"{', '.join(reproducing)} each alone give it"
        return f"not named: {why} (moved alone: {moved})"
    package = reproducing[0]
    changes = entry.get("changes") or []
    timeline = " · ".join(f"{c['direction']} with {package} {c['release']} ({c['last_before']} before it: "
                          f"{c['before']})" for c in changes)  # fmt: skip
    if not entry.get("release"):
        return f"{package} alone gives it; {entry.get('note') or timeline or 'the sweep found no change'}"
    said = f"{package} {entry['release']}: {timeline} (each package moved alone: {moved})"
    stepped = entry.get("stepped_over") or []
    if stepped:
        said += f"; no evidence at {', '.join(stepped)}"
    return said + _upstream_words(package, entry["release"], before, after, config)


def _upstream_words(package: str, release: str, before: str, after: str, config: dict[str, Any] | None = None) -> str:
    """The upstream records of the change: the failure that ends (its 'ends' record), the one that shows from then
    on (its 'appears' record), of the feature the config holds; each agrees where it names the same package and
    release."""
    from scenarios.failure_names import upstream_change

    configs = [config] if config else None
    found = []
    if before != "pass":
        found.append(upstream_change(before, "not-reproduced", (package, release), configs))
    if after != "pass":
        found.append(upstream_change(after, "target", (package, release), configs))
    known = [k for k in found if k is not None]
    if not known:
        return "; no upstream record names this change"

    def verdict(k: dict[str, str]) -> str:
        same = (k["package"], k["release"]) == (package, release)
        return "agrees" if same else f"differs: {k['package']} {k['release']}"

    words = [f"{k['source']} ({verdict(k)})" for k in known]
    return "; upstream: " + "; ".join(words)


def write(store: Store) -> Path | None:
    text = render(store)
    if text is None:
        return None
    path = store.results_dir / OUTPUT
    path.write_text(text)
    return path
