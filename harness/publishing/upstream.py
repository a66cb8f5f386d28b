"""A ready-to-file upstream bug report for one reproducer, in the shape Hugging Face's bug template asks for
(System Info, Reproduction, Expected behavior; DeepSpeed's asks for the same facts under other headings).

Everything comes from the run's own record and the reproducer file; nothing is typed in by hand.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.define.packages import PINNED_PACKAGES
from harness.errors import UsageError
from harness.knowledge.atlas import Atlas
from harness.knowledge.store import Store, read_script_blame, read_script_verdict
from harness.recording.flip import Flip


def find_entry(store: Store, which: str) -> dict[str, Any]:
    """The index entry of a reproducer named by its file name, its path, or its id."""
    index_path = store.results_dir / "repros" / "index.json"
    if not store.repro_index:
        raise UsageError(f"no reproducer in {index_path}; run `nox -s report` (or a matrix) first")
    name = Path(which).name
    name = name if name.endswith(".py") else f"{name}.py"
    for entry in store.repro_index:
        if entry["file"] == name:
            return entry
    raise UsageError(f"{which}: no such reproducer in {index_path}")


def report_body(atlas: Atlas, entry: dict[str, Any], repros: Path | None = None) -> str:
    """The issue body (Markdown) for the failure behind `entry`: its record as the table holds it (a shared cell is
    `<cell>@<profile>` there, as in the index), the flips of the runs the table shows."""
    key = (str(entry.get("run_id")), entry["cell"], entry["scenario"], entry["variant"], str(entry["config_id"]))
    record = atlas.records_by_key.get(key)
    if record is None:
        raise UsageError(f"run {entry.get('run_id')}: no record for {entry['file']} in the table")
    source = atlas.store.repro_source(entry["file"], repros)
    versions = record.get("versions") or {}
    hw = record.get("hardware") or {}
    device = hw.get("device", "cpu") + (
        f" ({hw.get('gpu_count')} x {hw.get('gpu_name')})" if hw.get("gpu_name") else ""
    )
    fixes = entry.get("passing_fixes") or []
    lines = [
        "### System Info\n",
        *[f"- `{name}`: {versions[name]}" for name in ("python", *PINNED_PACKAGES) if name in versions],
        f"- device: {device}, world size {hw.get('world_size', 1)}",
        f"- found by the compat-matrix harness, run `{entry.get('run_id')}`, cell `{entry['cell']}`",
        "",
        "### Reproduction\n",
        f"A self-contained script (PEP 723 pins of the exact versions above): `uv run {entry['file']}`"
        + (" (it starts itself under torchrun)." if entry.get("distributed") else "."),
        "",
        "```python",
        source.rstrip(),
        "```",
        "",
        "### Expected behavior\n",
        "Training runs and the adapters update; no exception.",
        "",
        "### Actual behavior\n",
        f"`{record.get('exc_type') or record['outcome']}`: {(record.get('message') or '').strip()[:1500]}",
        "",
    ]
    if record.get("traceback"):
        lines += [
            "<details><summary>Traceback</summary>",
            "",
            "```",
            record["traceback"].strip(),
            "```",
            "",
            "</details>",
            "",
        ]
    if fixes:
        lines += [
            f"Workarounds that pass on the same config: {', '.join(f'`{f}`' for f in fixes)} "
            f"(`uv run {entry['file']} --variant <name>`).",
            "",
        ]
    flips = _flips(atlas, entry["scenario"])
    if flips:
        lines += ["First release where the outcome flips (bisected by the harness):", *flips, ""]
    if record.get("known_issue"):
        lines += ["Related: " + ", ".join(record["known_issue"]), ""]
    return "\n".join(lines)


def _flips(atlas: Atlas, scenario: str) -> list[str]:
    """The releases a bisect named, then the flips of the runs the table shows (never a superseded run's)."""
    found = [f"- {v.package} {v.release} (bisect)" for v in atlas.bisect_verdicts if v.scenario == scenario
             and v.release]  # fmt: skip
    for flip in atlas.flips:
        if flip.scenario == scenario and flip.package and flip.release:
            change = "appears" if flip.newer_state == "target" else "ends"
            found.append(f"- {flip.package} {flip.release}: the failure {change} there (history flip between "
                         f"{flip.older} and {flip.newer})")  # fmt: skip
    return found


#: Where each package files its issues (for the issue body a script bisect writes).
PROJECTS = {
    "torch": "pytorch/pytorch",
    "transformers": "huggingface/transformers",
    "peft": "huggingface/peft",
    "accelerate": "huggingface/accelerate",
    "trl": "huggingface/trl",
    "deepspeed": "deepspeedai/DeepSpeed",
    "bitsandbytes": "bitsandbytes-foundation/bitsandbytes",
}


def script_issue_body(
    verdict: dict[str, Any], script: str, flip: Flip, runs: list[dict[str, Any]], folder: Path | None = None
) -> str:
    """The issue body (Markdown) for a user script's failure that a bisect pinned on one release. System Info is
    what really ran: the first failing run's versions beside the last passing run's (the packages that matter first,
    every package of the failing run folded away), never a day's stack with one version swapped in by hand."""
    package, first, last = flip.package, flip.release, flip.last_release_before
    distributed = verdict.get("torchrun", verdict["nproc"] > 1)
    launch = f"torchrun --nproc-per-node {verdict['nproc']} " if distributed else "python "
    started = flip.newer_state == "target"
    held = ", ".join(f"{p}=={v}" for p, v in flip.held.items() if p in PINNED_PACKAGES)
    project = PROJECTS.get(package or "")
    where = f"https://github.com/{project}/issues/new" if project else f"the {package} project's issue tracker"
    failing, passing = ran_pair(flip, runs)
    change = f"since {package} {first} (last good: {last})" if started else f"until {package} {first} fixed it"
    error = verdict["target"]["error"] or verdict["target"]["signature"] or "the failure"
    lines = [
        f"<!-- for {where} -->",
        f"**{issue_title(error, change)}**",
        "",
        "### System Info\n",
        *system_info(failing, passing, script, fixed=not started),
        f"- launched as `{launch}{verdict['script']}` on {_machine(verdict)}",
        f"- measured in the failing run: {setup_words((failing or {}).get('setup'))}",
        *([f"- measured in the passing run: {setup_words(passing.get('setup'))}"] if passing else []),
        "",
        "### Reproduction\n",
        f"`{launch}{verdict['script']}`:",
        "",
        "```python",
        script.rstrip(),
        "```",
        "",
        "### Expected behavior\n",
        f"The script exits 0, as it does with {package}=={last if started else first}.",
        "",
        "### Actual behavior\n",
        f"With {package}=={first if started else last}:",
        "",
        "```",
        str((failing or {}).get("error_text") or error),
        "```",
        "",
        "### Which release\n",
        f"Found by `compat-matrix bisect-script`: between the stacks of {flip.older} and {flip.newer} only "
        f"moving {package} alone from {flip.changed[package][0]} to {flip.changed[package][1]} reproduces the "
        f"change (others held: {held}); bisecting {len(flip.candidates)} releases of {package} in "
        f"{len(flip.bisect_runs)} runs: last good {last}, first bad {first}."
        if started
        else f"Found by `compat-matrix bisect-script`: between the stacks of {flip.older} and {flip.newer} only "
        f"moving {package} alone from {flip.changed[package][0]} to {flip.changed[package][1]} reproduces the "
        f"change (others held: {held}); the last release that fails is {last}, the first release that passes is "
        f"{first}.",
    ]
    if flip.note:
        lines += ["", f"Note: {flip.note}"]
    lines += _script_blame_lines(folder, flip)
    return "\n".join(lines) + "\n"


def _script_blame_lines(folder: Path | None, flip: Flip) -> list[str]:
    """The verdict's blame (blame.json beside it, `blame-script`), where it is of this flip."""
    from harness.publishing.blame_section import blame_section

    blame, changed = read_script_blame(folder)
    if blame is None or blame.get("flip") != [flip.older, flip.newer]:
        return []
    return blame_section(blame, changed, str(flip.package), str(flip.release))


#: The longest title an issue body opens with (what a maintainer reads in a second; the whole message is below).
TITLE_LIMIT = 116


def issue_title(error: str, change: str) -> str:
    """The exception's first sentence and the release, at most TITLE_LIMIT characters: the exception's type
    without its module path, a file path in parentheses dropped (it is the machine's, not the failure's)."""
    first = error.strip().splitlines()[0] if error.strip() else error
    kind, sep, message = first.partition(": ")
    if sep and re.fullmatch(r"[\w.]+", kind):
        first = f"{kind.rsplit('.', 1)[-1]}: {message}"
    first = re.sub(r"\s*\((?:/|[A-Za-z]:\\)[^)]*\)", "", first)
    first = re.split(r"(?<=[^.\s]{2})\.(?:\s|$)", first, maxsplit=1)[0]
    room = TITLE_LIMIT - len(change) - 1
    if len(first) > room:
        first = first[: room - 1].rstrip() + "…"
    return f"{first} {change}"


def setup_words(setup: dict[str, Any] | None) -> str:
    """What a script run measured inside its ranks, in a few words ('cuda, 2 x NVIDIA H200, world size 2 (nccl);
    accelerate FSDP: wrapped by fsdp2, state dict FULL_STATE_DICT, mixed precision bf16'), or that it measured
    nothing (runs made before the harness measured them say nothing about their setup)."""
    if not setup:
        return "setup not measured (the run predates measuring it)"

    def one(value: Any) -> str:
        return " / ".join(str(v) for v in value) if isinstance(value, list) else str(value)

    parts = [one(setup.get("device") or "no torch imported")]
    if setup.get("gpu_count"):
        parts.append(f"{one(setup['gpu_count'])} x {one(setup.get('gpu_names') or 'GPU')} visible")
    if setup.get("world_size"):
        backend = f" ({one(setup['backend'])})" if setup.get("backend") else ""
        parts.append(f"world size {one(setup['world_size'])}{backend}")
    else:
        parts.append("no process group seen")
    text = ", ".join(parts)
    if setup.get("distributed_type"):
        # No wrapper seen is what the probe can say (runs before it read a list from prepare missed FSDP2's).
        details = [f"wrapped by {one(setup['wrapped_by'])}" if setup.get("wrapped_by") else "no wrapper seen"]
        if setup.get("fsdp_plugin_version"):
            details.append(f"FSDP plugin version {one(setup['fsdp_plugin_version'])}")
        if setup.get("state_dict_type"):
            details.append(f"state dict {one(setup['state_dict_type'])}")
        if setup.get("state_dict_type_at_save"):
            details.append(f"at save {one(setup['state_dict_type_at_save'])}")
        if setup.get("zero_stage") is not None:
            details.append(f"ZeRO stage {one(setup['zero_stage'])}")
        if setup.get("mixed_precision"):
            details.append(f"mixed precision {one(setup['mixed_precision'])}")
        text += f"; accelerate {one(setup['distributed_type'])}: " + ", ".join(details)
    elif setup.get("wrapped_by") or setup.get("zero_stage") is not None:
        # The script built its engine itself (deepspeed.initialize): what wrapped the model, measured all the same.
        engine = [f"wrapped by {one(setup['wrapped_by'])}"] if setup.get("wrapped_by") else []
        engine += [f"ZeRO stage {one(setup['zero_stage'])}"] if setup.get("zero_stage") is not None else []
        text += "; its own engine: " + ", ".join(engine)
    return text


def _machine(verdict: dict[str, Any]) -> str:
    """Where the runs ran, in the words of an issue's System Info: CPU, or the node's GPUs and CUDA."""
    device = verdict.get("device") or {}
    if device.get("kind", "cpu") == "cpu":
        return "CPU"
    if device.get("kind") != "cuda":
        return "a machine whose torch could not say its device"
    return f"{device.get('name')} GPUs (CUDA {device.get('cuda')}, torch {device.get('torch')})"


#: Outcomes of a script run that count as the failure side of a flip.
_FAILED = ("fail", "timeout")


def ran_pair(flip: Flip, runs: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the failing run, the passing run) of a flip: for a break the first release that fails and the last that
    passes, for a fix the last release that fails and the first that passes; the runs with the package at those
    releases, the moved and bisected ones first, then the days' own stacks."""
    package, first, last = flip.package, flip.release, flip.last_release_before
    bad, good = (first, last) if flip.newer_state == "target" else (last, first)

    def find(version: str | None, failed: bool) -> dict[str, Any] | None:
        def versions(run: dict[str, Any]) -> dict[str, str]:
            return (run.get("stack") or {}).get("versions") or {}

        fits = [
            r for r in runs if versions(r).get(package or "") == version and (r.get("outcome") in _FAILED) == failed
        ]
        at = re.compile(rf"=={re.escape(version or '')}(?: \(with .*\))?$")
        moved = [r for r in fits if r.get("phase") in ("move", "bisect") and at.search(r["label"])]
        ends = [r for r in fits if r.get("label") in (flip.older, flip.newer)]
        return (moved or ends or fits or [None])[0]

    return find(bad, True), find(good, False)


def system_info(
    failing: dict[str, Any] | None, passing: dict[str, Any] | None, script: str, fixed: bool = False
) -> list[str]:
    """The packages that matter (the matrix's packages, then the script's own imports) as a failing | passing table,
    and every package of the failing run in a folded block. For a break the runs are the first release that fails and
    the last that passes; for a fix (`fixed`), the last release that fails and the first that passes."""
    bad = ((failing or {}).get("stack") or {}).get("versions") or {}
    good = ((passing or {}).get("stack") or {}).get("versions") or {}
    names = [n for n in ("python", *PINNED_PACKAGES) if n in bad or n in good]
    names += [n for n in _imported_distributions(script, bad) if n not in names]
    fails, passes = ("The last release that fails", "the first release that passes") if fixed else (
        "The first release that fails", "the last release that passes")  # fmt: skip
    said = f"{fails} (`{_shown((failing or {}).get('label', '?'))}`)"
    said += f" and {passes} (`{_shown(passing['label'])}`):" if passing else " (no passing run of that release):"
    lines = [said, "", "| package | failing | passing |", "|---|---|---|"]
    lines += [f"| `{n}` | {bad.get(n, '-')} | {good.get(n, '-')} |" for n in names]
    if bad:
        lines += [
            "",
            f"<details><summary>Every package of the failing run ({len(bad)})</summary>",
            "",
            "```",
            *[f"{n}=={v}" for n, v in sorted(bad.items()) if n != "python"],
            "```",
            "",
            "</details>",
            "",
        ]
    return lines


def _shown(label: str) -> str:
    """A run's label as an issue shows it: a long list of what moved with a package is counted, not listed
    (every package is in the table and the folded freeze below)."""
    head, sep, rest = label.partition(" (with ")
    moved = rest.rstrip(")").split(", ") if sep else []
    return f"{head} (with {len(moved)} other packages)" if len(moved) > 6 else label


def _imported_distributions(script: str, versions: dict[str, str]) -> list[str]:
    """The distributions of the modules the script imports at top level, where the run had them."""
    import ast

    try:
        tree = ast.parse(script)
    except SyntaxError:
        return []
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.append(node.module.split(".")[0])
    found = []
    for module in dict.fromkeys(modules):
        for name in (module, module.replace("_", "-"), module.lower()):
            if name in versions and name not in found:
                found.append(name)
                break
    return found


def script_report(folder: Path) -> str:
    """The issue body for a bisect-script verdict folder (its verdict.json and the script it ran)."""
    verdict, script, runs = read_script_verdict(folder)
    named = [f for f in (Flip.from_json(x) for x in verdict["flips"]) if f.package and f.release]
    if not named:
        raise UsageError(f"{folder}: the bisect named no release, so there is nothing to report upstream")
    return script_issue_body(verdict, script, named[0], runs, folder)
