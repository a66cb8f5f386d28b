"""The answer at a glance: the first table of COMPATIBILITY.md. Rows are named by the versions that were really
imported (not cell ids), newest first, grouped by device and world size; each entry is one symbol, the count,
and the first change to try (a real fix before a workaround: the first one the detailed entry lists)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.define import setup as vocabulary
from harness.define.packages import AXIS_PACKAGES
from harness.knowledge import pitfalls as knowledge
from harness.knowledge.atlas import Atlas
from harness.knowledge.entries import Entry
from harness.knowledge.judge import Query, fix_answers
from harness.recording.verdicts import Format, first_change, headline, largest_off_by, variant_kinds, verdict
from harness.textsafe import md, slug
from scenarios.fix_words import fix_words

#: Longest entry of the glance table (the details are one anchor below).
ENTRY_LIMIT = 120
SYMBOLS = {
    "target": "✗",
    "failures": "✗",
    "not-reproduced": "✓",
    "passes": "✓",
    "skip": "n/a",
    "env-broken": "env",
    "install-failed": "inst",
}
#: What the symbols mean (the site shows this under its grid).
SYMBOLS_LEGEND = (
    "✗ k/n: the failure shows on k of n configs, then the first change to try (fix, or workaround: w/a; "
    "'a fix per config': no one change fixes them all, each has its own, in the summary below; 'partly X (i/k)': "
    "the best change measured fixes i of the k; 'no fix measured': none fixed any); "
    "✓: not reproduced; (!): other failures there; n/a: not applicable on this machine; env/inst: the stack "
    "could not run or install; -: not run. A GPU table holds the runs made on that many GPUs (distributed scenarios "
    "at that many ranks, single-process ones at one); each world size shows its own newest evidence."
)
LEGEND = (
    SYMBOLS_LEGEND + " A column's name links to its scenario's section (variants, reproducers, upstream links); "
    "every entry's detail is in the summary below."
)


def entry(found: Any, spec: dict[str, Any] | None, pitfalls: int = 0) -> str:
    """'✗ 5/6 · try cast_forward_inputs', '✓ 0/4 (!)', 'n/a', within ENTRY_LIMIT characters; ' · ⚠ 1 pitfall' where
    configs that fail on every release were left out of the count (listed once, under the glance), and '⚠ pitfall'
    alone where nothing else of the scenario ran there."""
    text = _entry(found, spec)
    if pitfalls:
        text = "⚠ pitfall" if text in ("-", "n/a") else f"{text} · ⚠ {pitfalls} pitfall{'s' if pitfalls > 1 else ''}"
    return text if len(text) <= ENTRY_LIMIT else text[: ENTRY_LIMIT - 1] + "…"


def _entry(found: Any, spec: dict[str, Any] | None) -> str:
    if found is None or found.state in ("empty", "no-baseline"):
        return "-"
    symbol = SYMBOLS.get(found.state, found.state)
    if found.state in ("target", "failures"):
        text = f"{symbol} {len(found.target_records)}/{found.candidates}" + discrepancy_note(found, spec)
        change = first_change(found, spec)
        if change:
            text += f" · try {fix_words(change[0])}" + ("" if change[1] == "fix" else " (w/a)")
        elif found.fixed_per_config:
            text += " · a fix per config"
        elif found.partly:  # a change measured to fix some of the configs, not all: not "no fix measured"
            kinds = variant_kinds(spec)
            name, count = min(found.partly, key=lambda p: (kinds.get(p[0]) != "fix", -p[1], p[0]))
            marker = "" if kinds.get(name) == "fix" else "w/a, "
            text += f" · partly {fix_words(name)} ({marker}{count}/{len(found.target_records)})"
        else:
            text += " · no fix measured"
    elif found.state in ("not-reproduced", "passes"):
        text = f"{symbol} 0/{found.candidates}" + (" (!)" if found.others else "")
    else:
        text = symbol
    return text


def discrepancy_note(found: Any, spec: dict[str, Any] | None) -> str:
    """' · off 0.39x': how far the target's records are off their hand reference, at most, in units of what they
    compare (the update, or the adapter's effect), for scenarios that measure it (S9's `off_by`): a reader sees the
    size of a silent failure, not only that it failed."""
    largest = largest_off_by(found.target_records, spec)
    return f" · off {largest:.2g}x" if largest is not None else ""


def column_labels(scenarios: list[str]) -> list[str]:
    """'S2' for a mode with one scenario; where a mode has several, each gets the words only it has
    ('S2', 'S2 fsdp')."""
    labels = []
    for scenario in scenarios:
        mode, words = scenario.split("-")[0], set(scenario.split("-")[1:])
        siblings = [set(s.split("-")[1:]) for s in scenarios if s.split("-")[0] == mode and s != scenario]
        own = [w for w in scenario.split("-")[1:] if siblings and all(w not in other for other in siblings)]
        labels.append(" ".join([mode, *own]) if words else mode)
    return labels


def what_it_tests(spec: dict[str, Any] | None) -> str:
    """A scenario in a few words, for a column head: its title up to the first colon ('DoRA + FSDP + gradient
    checkpointing')."""
    title = str((spec or {}).get("title") or "")
    return title.split(": ", 1)[0]


def scenario_anchor(scenario: str) -> str:
    """The anchor of a scenario's detailed section (its variant table, reproducers, upstream links)."""
    return "scenario-" + slug(scenario)


def glance_tables(atlas: Atlas) -> list[dict[str, Any]]:
    """One table per (device, world size): its scenario columns and its rows (`Atlas.rows`: a stack that ran, split
    where a cell's records ran other versions), newest first, each named by the versions its records ran, with one short
    entry per scenario. Each entry is a view of the atlas's (`Atlas.entries`, the one fold): the symbol is the judge's
    (a known failure of the scenario applies, measured at exactly the row's releases), its count and first fix the
    records' there (pitfall configs never counted); `failing` lists the setups whose failure applies there, so the
    page narrows the grid to a user's setup without judging again."""
    specs = atlas.specs
    scenarios = atlas.scenarios
    groups: dict[tuple[str, int], list[tuple[tuple, dict[str, Any]]]] = defaultdict(list)
    for found_row, label, entries in zip(atlas.rows, atlas.row_labels, atlas.entries, strict=True):
        device = "GPU" if found_row.device == "cuda" else "CPU"
        order = tuple(found_row.versions.get(p) or "0" for p in AXIS_PACKAGES)
        row = {"label": label, "cell": found_row.cell, "day": found_row.day, "versions": dict(found_row.versions),
               "entries": [glance_entry(atlas, e) for e in entries]}  # fmt: skip
        groups[(device, found_row.ranks)].append((order, row))
    tables = []
    for (device, ranks), rows in sorted(groups.items()):
        newest_first = sorted(rows, key=lambda item: (tuple(map(_as_version, item[0])), item[1]["label"]), reverse=True)
        tables.append(
            {
                "device": device,
                "ranks": ranks,
                "title": _title(device, ranks),
                "columns": [
                    {"scenario": s, "label": label, "what": what_it_tests(specs.get(s))}
                    for s, label in zip(scenarios, column_labels(scenarios), strict=True)
                ],
                "rows": [row for _, row in newest_first],
            }
        )
    return tables


def glance_text(atlas: Atlas, found: Entry) -> str:
    """'✗ 5/6 · try ...': the verdict's count and first fix, the judge's symbol (its failure shows here)."""
    text = entry(found.verdict, atlas.specs.get(found.scenario), len(found.pitfalls)) if found.ran else "-"
    if found.failing and not text.startswith("✗"):
        text = f"✗ {text}" if text != "-" else "✗ (records of other runs at these releases)"
    return text


def entry_lines(found: Entry, spec: dict[str, Any] | None, code: Format = str, text: Format = str) -> list[str]:
    """An entry in full (the summary's cell, matrix.json's `headline`): its verdict's lines, then the pitfall
    configs left out of its count, by id."""
    lines = headline(found.verdict or verdict([], spec), spec, code, text)
    if found.pitfalls:
        lines.append(f"pitfall configs not counted: {', '.join(code(c) for c in found.pitfalls)}")
    return lines


def glance_entry(atlas: Atlas, found: Entry) -> dict[str, Any]:
    """An entry as the glance shows it: its text (the verdict's count and first fix, the judge's symbol), state,
    the judge's word, the setups it fails for (each with the settings that clear it there) and the pitfalls left
    out."""
    return {
        "scenario": found.scenario,
        "text": glance_text(atlas, found),
        "state": found.state,
        "judged": found.judged,
        # Each setup the failure applies to there, and the settings (a fix's) that clear it where a user has them.
        "failing": sorted(
            {
                json.dumps({"setup": k, "unless": _clearing(atlas, a["id"], found.row.query())}, sort_keys=True)
                for a in found.failing
                for k in a.get("setups", [])
            }
        ),
        "pitfalls": found.pitfalls,
    }


def _title(device: str, ranks: int) -> str:
    """'CPU, up to 2 ranks'; 'GPU, 2 ranks' for the runs made on 2 GPUs (their single-process scenarios at one)."""
    plural = "s" if ranks > 1 else ""
    return f"CPU, up to {ranks} rank{plural}" if device == "CPU" else f"GPU, {ranks} rank{plural}"


def _clearing(atlas: Atlas, failure_id: str, query: Query) -> list[dict[str, str]]:
    """The settings a user's setup can hold that fix this failure at the row's releases and GPU count, as the judge
    decides (exact or bracketed): a fix measured only elsewhere clears nothing here."""
    failure = next(f for f in atlas.tables["failures"] if f["id"] == failure_id)
    held = [f for f in fix_answers(atlas.tables, failure, query) if f.get("setup") and f["state"] == "fixes"]
    return [f["setup"] for f in held]


def glance_markdown(atlas: Atlas) -> list[str]:
    """The glance table's lines: one table per (device, world size), rows named by versions, newest first; then the
    pitfalls, once each."""
    pitfalls = atlas.pitfalls
    specs = atlas.specs
    lines = ["## The answer at a glance", "", LEGEND, ""]
    tables = glance_tables(atlas)
    if tables:
        heads = "; ".join(f"**{md(c['label'])}**: {md(c['what'])}" for c in tables[0]["columns"] if c["what"])
        lines += [f"Columns: {heads}.", ""]
    for table in tables:
        lines += [f"### {table['title']}", ""]
        links = [f"[{md(c['label'])}](#{scenario_anchor(c['scenario'])})" for c in table["columns"]]
        lines.append("| versions | " + " | ".join(links) + " |")
        lines.append("|---|" + "---|" * len(table["columns"]))
        for row in table["rows"]:
            lines.append(f"| {md(row['label'])} | " + " | ".join(md(e["text"]) for e in row["entries"]) + " |")
        lines.append("")
    return lines + pitfalls_markdown(pitfalls, specs)


def pitfall_rows(
    pitfalls: dict[tuple[str, str], knowledge.Pitfall], specs: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each pitfall once, in words: scenario, device, setup, why, where measured, how far off, the way out (for the
    Markdown list, matrix.json and the site)."""
    rows = []
    for pitfall in sorted(pitfalls.values(), key=lambda p: (p.scenario, p.device, p.config_id)):
        spec = specs.get(pitfall.scenario)
        kinds = variant_kinds(spec)
        off = ""
        if pitfall.off_by:
            low, high = pitfall.off_by
            off = f"off {low:.2g}x" if f"{low:.2g}" == f"{high:.2g}" else f"off {low:.2g}x to {high:.2g}x"
        fixes = [
            fix_words(n) + ("" if kinds.get(n) == "fix" else " (w/a)")
            for n in sorted(pitfall.fixes, key=lambda n: kinds.get(n) != "fix")
        ]
        rows.append(
            {
                "scenario": pitfall.scenario,
                "config_id": pitfall.config_id,
                "device": "GPU" if pitfall.device == "cuda" else "CPU",
                "setup": vocabulary.config_words(pitfall.config, spec),
                "why": pitfall.words(spec),
                "measured": f"{pitfall.stacks} stacks, {pitfall.first_day} to {pitfall.last_day}",
                "off": off,
                "way_out": ", ".join(fixes) or "no measured change removes it",
                "failure": pitfall.family,
            }
        )
    return rows


def pitfalls_markdown(
    pitfalls: dict[tuple[str, str], knowledge.Pitfall], specs: dict[str, dict[str, Any]]
) -> list[str]:
    """'### Pitfalls': each config that fails on every release measured, once; the grid's counts leave them out."""
    rows = pitfall_rows(pitfalls, specs)
    if not rows:
        return []
    lines = [
        "### Pitfalls: setups that fail on every release measured",
        "",
        "Not a version failure: each config below shows its scenario's failure on every install day it ran on that "
        "device (every other record of it, probes included, never passed), so no upgrade or pin leaves it; the grid's "
        "k/n counts leave them out (⚠ marks where one was left out). The way out is a change of the setup.",
        "",
        "| scenario | device | setup | what | measured | way out |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        what = md(row["why"]) + (f" ({md(row['off'])})" if row["off"] else "")
        lines.append(
            f"| {md(row['scenario'])} | {row['device']} | {md(row['setup'])} | {what} | {md(row['measured'])} | "
            f"{md(row['way_out'])} |"
        )
    return [*lines, ""]


def pick_options(tables: list[dict[str, Any]], packages: list[str]) -> dict[str, list[str]]:
    """package -> the major.minor releases the grid's rows hold, newest first (what the version picker offers)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for table in tables:
        for row in table["rows"]:
            for package, version in row["versions"].items():
                seen[package].add(".".join(version.split(".")[:2]))
    return {p: sorted(seen[p], key=_as_version, reverse=True) for p in packages if seen.get(p)}


def _as_version(value: str | None) -> Version:
    try:
        return Version(value or "0")
    except InvalidVersion:
        return Version("0")
