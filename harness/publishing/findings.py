"""Findings for maintainers, as they read: one finding per failure that no upstream record names, with its verified
reproducer, the release that brought (or ended) it, the code that changed, and an issue body in the upstream bug
template's shape; and FINDINGS.md, which lists them and the ones a later run no longer shows.

Everything an issue body states comes from a record: the verification runs (`runs.jsonl`: exit codes, the
reproducer's own last line, the versions its processes imported), the traced comparison (`changed.json`), the atlas
flip that found it (`results/flips/<run>/flips.json`) and the scenario's records on the flip's days (which fixes
passed). `finding.toml` holds only what no run measures: where it came from and what was searched upstream.
"""

from __future__ import annotations

from typing import Any

from harness.knowledge.atlas import Atlas
from harness.knowledge.findings import Finding
from harness.knowledge.selection import retired
from harness.knowledge.store import Store
from harness.publishing.blame_section import blame_section
from harness.publishing.upstream import issue_title as upstream_title
from harness.recording.flip import Flip
from harness.recording.verdicts import variant_kinds
from harness.textsafe import code, md

#: Changed functions whose diff the issue body shows (the last called first; changed.json holds them all).
DIFFS_SHOWN = 3


def still_seen(finding: Finding, store: Store) -> str | None:
    """None while the atlas flip that found it still stands (its run not superseded, the flip in its flips.json with
    the same package and releases); else why it is no longer seen."""
    if finding.probe:
        return _probe_still_seen(finding, store)
    run = finding.flip.get("run", "")
    if run not in store.metas:
        return f"its run {run} is not in results/runs"
    if retired(store.metas[run]):
        return f"its run {run} is superseded or withdrawn"
    flips = [Flip.from_json(e) for e in store.flip_files.get(run, [])]
    for flip in flips:
        same_day = (flip.scenario, flip.older, flip.newer) == (
            finding.scenario,
            finding.flip.get("older"),
            finding.flip.get("newer"),
        )
        if same_day and (flip.family or flip.signature) in (finding.signature, finding.flip.get("family")):
            first, before = (
                (finding.bad, finding.good) if finding.direction == "starts" else (finding.good, finding.bad)
            )
            if (flip.package, flip.release, flip.last_release_before) == (finding.package, first, before):
                return None
            return f"the flip now reads {flip.package or 'not named'} {flip.release or ''}".rstrip()
    return f"no flip of {finding.scenario} between {finding.flip.get('older')} and {finding.flip.get('newer')} in {run}"


def _probe_still_seen(finding: Finding, store: Store) -> str | None:
    """A finding found by a probe (no atlas flip names it): None while the probe run's record of the config still shows
    the failure by today's rules."""
    run = str(finding.probe.get("run"))
    records = store.records_of_run_named(run)
    if records is None:
        return f"its probe run {run} is not under {store.results_dir}"
    mine = [r for r in records if r["config_id"] == finding.probe.get("config") and r["variant"] == "baseline"]
    if any(r.get("signature") == finding.signature for r in mine):
        return None
    return f"its probe run {run} no longer shows {finding.signature} on config {finding.probe.get('config')}"


def fixes_that_pass(finding: Finding, atlas: Atlas, spec: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(variant, kind, what it does) of every change that removed the failure on the flip's failing day, from the
    scenario's records there (the table's own verdict, by the atlas's one pitfall rule)."""
    if finding.probe:
        return []  # no atlas day holds the finding's own flip: its fixes are in the table, per day
    run = finding.flip.get("run", "")
    day = finding.flip.get("newer") if finding.direction == "starts" else finding.flip.get("older")
    records = [
        r
        for r in atlas.store.run_records(run)
        if r["scenario"] == finding.scenario and (r.get("pins") or {}).get("date") == day
    ]
    found = atlas.verdict_of(records, finding.scenario)
    if found is None:
        return []
    kinds = variant_kinds(spec)
    described = {name: value[1] for name, value in ((spec or {}).get("variants") or {}).items()}
    return [(name, kinds.get(name, "fix"), described.get(name, "")) for name in found.fixed]


def issue_title(finding: Finding) -> str:
    """What the user sees and the release, by the one title rule of every issue body (`upstream.issue_title`)."""
    bad = finding.runs.get("bad") or {}
    return upstream_title(str(bad.get("line") or finding.title).removeprefix("FAIL: "), finding.release_words())


def issue_body(finding: Finding, atlas: Atlas | None = None, spec: dict[str, Any] | None = None) -> str:
    """The issue body, in the shape of the upstream bug template (System Info, Reproduction, Expected, Actual), plus
    the release, the code that changed and the workaround."""
    bad, good = finding.runs.get("bad") or {}, finding.runs.get("good") or {}
    names = sorted({*bad.get("versions", {}), *good.get("versions", {})})
    lines = [
        f"<!-- for https://github.com/{finding.repository}/issues/new -->",
        f"**{issue_title(finding)}**",
        "",
        "### System Info\n",
        f"The two runs of the reproducer below (`uv run repro.py`{_on_gpus(finding)}), as their processes imported "
        "them "
        f"({'verified' if finding.verified else 'NOT verified: the runs do not flip as the atlas did'}"
        f"{'; ' + finding.machines_words() if finding.machines_words() else ''}):",
        "",
        f"| package | failing ({finding.package} {finding.bad}) | passing ({finding.package} {finding.good}) |",
        "|---|---|---|",
        *[f"| `{n}` | {bad.get('versions', {}).get(n, '-')} | {good.get('versions', {}).get(n, '-')} |" for n in names],
        "",
        "### Reproduction\n",
        f"`uv run repro.py` (its PEP 723 block pins every package; the passing run moves only {finding.package} to "
        f"{finding.good}):",
        "",
        "```python",
        finding.script_text.rstrip(),
        "```",
        "",
        "### Expected behavior\n",
        f"As with {finding.package}=={finding.good} (exit {good.get('exit_code')}): `{good.get('line')}`",
        "",
        "### Actual behavior\n",
        f"With {finding.package}=={finding.bad} (exit {bad.get('exit_code')}): `{bad.get('line')}`",
        "",
        "### Which release\n",
        _which_release(finding),
        "",
        "### The code that changed\n",
        *_changed_lines(finding),
        *_blame_lines(finding),
    ]
    fixes = fixes_that_pass(finding, atlas, spec) if atlas else []
    if fixes:
        lines += ["", "### Workaround\n"]
        lines += [f"- `{name}` ({kind}): {what}" for name, kind, what in fixes]
    searched = ", ".join(finding.searched) or "none recorded"
    link = f" ({finding.link})" if finding.link else ""
    lines += ["", "### Upstream\n", f"Status: {finding.status}{link}. Threads searched: {searched}."]
    return "\n".join(lines) + "\n"


def _on_gpus(finding: Finding) -> str:
    """' on 2 GPUs (NVIDIA H200 x 2)' for a reproducer that needs GPUs, from the machine its runs measured."""
    if not finding.gpus:
        return ""
    machine = (finding.runs.get("bad") or {}).get("machine") or {}
    names = ", ".join(machine.get("gpu") or [])
    return f" on {finding.gpus} GPUs" + (f" ({names} x {machine.get('gpus')})" if names else "")


def _which_release(finding: Finding) -> str:
    if finding.probe:
        probe = finding.probe
        return (
            f"Measured on {finding.gpus} GPUs, in the atlas's probes ({finding.scenario}, `{finding.signature}`): on "
            f"the install day {probe.get('older_day')}'s stack, moving {finding.package} alone to {finding.bad} brings "
            f"it (probe run `{probe.get('run')}`, day `{probe.get('day')}`, config {probe.get('config')}); the day "
            f"itself fails otherwise first (the uninterrupted run is off there), so no atlas flip names it. The "
            f"reproducer above, run on {finding.gpus} GPUs at {finding.bad} and at {finding.good} with every other pin "
            "held, shows the same."
        )
    flip = finding.flip
    where = (
        f"The atlas flip of run `{flip.get('run')}` ({finding.scenario}, `{finding.signature}`, between the install "
        f"days {flip.get('older')} and {flip.get('newer')}): moving {finding.package} alone reproduces the change, "
        f"and bisecting its releases gives "
    )
    if finding.direction == "starts":
        where += f"first bad **{finding.bad}**, last good {finding.good}."
    else:
        where += f"last bad {finding.bad}, first good **{finding.good}**."
    return where + " The reproducer above, run at both releases with every other pin held, shows the same."


def _blame_lines(finding: Finding) -> list[str]:
    """What putting the changed code back showed (`findings ID --verify --blame`)."""
    return blame_section(finding.blame, finding.changed, finding.package, finding.bad)


def _changed_lines(finding: Finding) -> list[str]:
    changed = finding.changed
    if not changed:
        return ["Not traced yet (`compat-matrix findings <id> --verify` traces both runs)."]
    intro = (
        f"Of the {changed['executed_both']} {finding.package} functions both runs executed, "
        f"{len(changed['changed'])} differ between {changed['older']} and {changed['newer']}"
    )
    lines = [intro + (", the last called in the failing run first:" if changed["changed"] else ".")]
    for function in changed["changed"][:DIFFS_SHOWN]:
        lines += ["", f"`{function['file']}::{function['qualname']}` ({function['older_lines']} -> "
                  f"{function['newer_lines']} lines):", "", "```diff", function["diff"], "```"]  # fmt: skip
    rest = changed["changed"][DIFFS_SHOWN:]
    if rest:
        names = ", ".join(f"`{f['file']}::{f['qualname']}`" for f in rest)
        lines += ["", f"Also changed, called earlier in the run (diffs in `changed.json`): {names}."]
    if changed.get("only_newer"):
        shown = ", ".join(f"`{name}`" for name in changed["only_newer"][:8])
        more = f" and {len(changed['only_newer']) - 8} more" if len(changed["only_newer"]) > 8 else ""
        lines += ["", f"Only the {changed['newer']} run executed: {shown}{more}."]
    if changed.get("native_below"):
        lines += [
            "",
            f"{finding.package} is compiled: these are its Python-level functions; what runs natively is not seen.",
        ]
    return lines


def findings_rows(store: Store) -> list[dict[str, Any]]:
    """One row per finding, the same for the terminal list and the site's section: what the user sees, the
    release, verified or not, still seen by the atlas or why not."""
    rows = []
    for finding in store.findings:
        gone = still_seen(finding, store)
        rows.append(
            {
                "id": finding.id,
                "status": finding.status,
                "title": finding.title,
                "sees": str((finding.runs.get("bad") or {}).get("line") or ""),
                "release": finding.release_words(),
                "verified": finding.verified,
                "changed": [f"{c['file']}::{c['qualname']}" for c in (finding.changed or {}).get("changed", [])][:3],
                "no_longer_seen": gone,
            }
        )
    return rows


def findings_list_lines(store: Store) -> list[str]:
    """One line per finding, for the terminal (`findings_rows`, as the site shows them)."""
    if not store.findings:
        return ["no findings under results/findings/"]
    lines = []
    for row in findings_rows(store):
        state = "verified" if row["verified"] else "NOT verified"
        seen = f"no longer seen ({row['no_longer_seen']})" if row["no_longer_seen"] else "seen"
        lines.append(f"{row['id']}: {row['status']}, {state}, {seen}: {row['title']} {row['release']}")
    return lines


def accounts_for(flip: Flip, store: Store) -> str | None:
    """How a flip of the table with no upstream record is accounted for: a finding's id, or the reason there is
    none (without-a-finding.toml); None where neither says anything."""
    for finding in store.findings:
        days = (finding.flip.get("older"), finding.flip.get("newer"))
        # A flip's family is its failure's, or for a scenario whose flips are per config, the config's series.
        if (finding.scenario, *days) == (flip.scenario, flip.older, flip.newer) and flip.family in (
            None,
            finding.signature,
            finding.flip.get("family"),
        ):
            return f"finding {finding.id}"
    for entry in store.without_a_finding["flip"]:
        key = (entry.get("scenario"), entry.get("older"), entry.get("newer"))
        if key == (flip.scenario, flip.older, flip.newer) and entry.get("family") in (None, flip.family):
            return str(entry.get("why", ""))
    return None


def findings_markdown(atlas: Atlas) -> str:
    """results/FINDINGS.md: the findings still seen (each with its issue body), then the ones no longer seen."""
    store, specs = atlas.store, atlas.specs
    seen = [(f, still_seen(f, store)) for f in store.findings]
    current = [f for f, gone in seen if gone is None]
    lines = [
        "# Findings for maintainers",
        "",
        "Generated by `nox -s report` from `results/findings/` (`compat-matrix findings` lists them, "
        "`compat-matrix findings ID` prints one issue body). Do not edit by hand.",
        "",
        "Failures the atlas found that no upstream record names: each with a standalone reproducer run at the "
        "first bad and the last good release (every other pin held), the code both runs executed that changed "
        "between them, and a ready issue body.",
        "",
        "| finding | status | what the user sees | release | reproducer | changed code |",
        "|---|---|---|---|---|---|",
    ]
    for finding in current:
        bad = finding.runs.get("bad") or {}
        changed = ", ".join(f"`{c['qualname']}`" for c in (finding.changed or {}).get("changed", [])) or "-"
        state = ("verified" if finding.verified else "**not verified**") + (
            f" ({md(finding.machines_words())})" if finding.machines_words() else ""
        )
        lines.append(
            f"| [{md(finding.id)}](#{finding.id}) | {md(finding.status)} | {code(bad.get('line') or finding.title)} | "
            f"{md(finding.release_words())} | {state} | {changed} |"
        )
    for finding in current:
        lines += [
            "",
            f'<a id="{finding.id}"></a>',
            "",
            f"## {finding.id}",
            "",
            issue_body(finding, atlas, specs.get(finding.scenario)),
        ]
    without = store.without_a_finding
    lines += ["", "## Without a finding, and why", ""]
    for entry in without["flip"]:
        family = f" ({entry['family']})" if entry.get("family") else ""
        lines.append(
            f"- flip {md(entry['scenario'])}{md(family)} {md(entry['older'])} .. {md(entry['newer'])}: "
            + md(entry["why"])
        )
    for entry in without["family"]:
        where = f" ({entry['where']})" if entry.get("where") else ""
        lines.append(f"- failure {code(entry['signature'])}{md(where)}: {md(entry['why'])}")
    gone = [(f, why) for f, why in seen if why is not None]
    lines += ["", "## No longer seen", ""]
    lines += [f"- {md(f.id)}: {md(why)}" for f, why in gone] or ["None: every finding's flip still stands."]
    return "\n".join(lines) + "\n"
