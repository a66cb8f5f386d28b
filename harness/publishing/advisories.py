"""Advisories that tools can read: each known failure of the model (`knowledge/failures.py`) in the OSV format that
pip-audit, osv-scanner and dependency bots read (`results/advisories/<ID>.json`, `index.json`), beside the judge's
own tables (`judge.json`, what `compat-matrix audit` and the page judge by). Made with the table, never by hand.

One advisory per known failure: a failure no release bounds (it shows on every stack its configs ran, or on some
with no release named between) is an advisory too, introduced at the earliest release measured, with no fix. Its OSV
`affected[]` has one entry per package its conditions name (or, with none, the packages its upstream record names),
with `ECOSYSTEM` ranges of `introduced` / `fixed` events. OSV reads `affected[]` as "any of these" and has no word for
a setup, so a tool reading only OSV fields may report a stack the conjunction or the setup would clear, but never
calls an affected stack clean: a failure already showing on the oldest release measured is open at `"0"` there.
`database_specific` holds what OSV cannot: the conjunction (`conditions`), the setups (in words and keys), the
condition on the user's model ("applies if"), the fixes, and the evidence: the records at exactly every event's
release and at the release before it, and why a release before is no release measured good (masked).

The two times are OSV's: `published` is set once, the first publication: the earliest of the first record that shows
the failure, the `published` of the advisory already in the folder and, in a git checkout, the commit that first added
its file (never moved later); `modified` moves only when a report changes the advisory's content (then it is that
report's time): a report from the same records rewrites no byte.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

from harness.knowledge.atlas import Atlas
from harness.knowledge.failures import Condition, KnownFailure
from harness.knowledge.findings import Finding
from harness.knowledge.judge import fix_where
from harness.knowledge.store import Store
from scenarios.failure_names import upstream, upstream_change, upstream_packages

SCHEMA_VERSION = "1.7.0"
FOLDER = "advisories"
#: The judge's tables beside the advisories (`judge.json`).
JUDGE_FILE = "judge.json"
SUMMARY_LIMIT = 200


def build(atlas: Atlas) -> list[dict[str, Any]]:
    """Every known failure of the atlas as an OSV advisory, in the judge's order."""
    tables = {f["id"]: f for f in atlas.tables["failures"]}
    return [
        _advisory(failure, tables[failure.id], atlas.store, [atlas.configs.get((failure.scenario, c), {})
                                                             for c in failure.config_ids])
        for failure in atlas.failures
    ]  # fmt: skip


def _advisory(
    failure: KnownFailure, table: dict[str, Any], store: Store, configs: list[dict[str, Any]]
) -> dict[str, Any]:
    where = "on GPUs" if failure.device == "cuda" else "on CPU"
    setups = [s["words"] for s in table["setups"]]
    condition = f"; applies if {table['detail']}" if table["detail"] else ""
    summary = clip(f"{failure.scenario}: {table['title']} ({where}, {'; '.join(setups)}{condition})")
    conditions = [_condition_json(c) for c in failure.conditions]
    evidence = [_evidence_json(c, store) for c in failure.conditions]
    off = [o.off_by for o in failure.observed if o.off_by is not None and failure.state(o) == "shows"]
    first = _first_shown(failure)
    return {
        "schema_version": SCHEMA_VERSION,
        "id": failure.id,
        "modified": first,  # `settle` sets both against the advisory already published
        "published": first,
        "summary": summary,
        "details": _details(failure, table, where, off),
        "affected": _affected(failure, table),
        "references": _references(failure, configs),
        "database_specific": {
            "scenario": failure.scenario,
            "failure": failure.signature,
            "device": failure.device,
            "world_size": failure.world_sizes,
            "setups": setups,
            "setup_keys": [s["keys"] for s in table["setups"]],
            "applies_if": table["detail"],
            "measured_with": table["measured_with"],
            "shape": failure.shape,
            "config_ids": failure.config_ids,
            "conditions": conditions,
            "conditions_are": "all of: every package's events hold together (OSV's affected[] is any of them)",
            "workarounds": [_fix_json(table, fix) for fix in table["fixes"]],
            "off_by": [min(off), max(off)] if off else None,
            "measured": {p: failure.measured(p) for p in failure.depends},
            "evidence": evidence,
            "judge": f"{JUDGE_FILE}#{failure.id}",
        },
    }


def _fix_json(table: dict[str, Any], fix: dict[str, Any]) -> dict[str, Any]:
    """A fix as the advisory states it: what it is and where it was measured doing what (per world size on GPUs); the
    judge decides at a user's releases (`judge.json`, `audit`), never the advisory."""
    found = {k: fix[k] for k in ("variant", "kind", "words") if k in fix}
    return found | ({"setup": fix["setup"]} if fix.get("setup") else {}) | {"measured": fix_where(table, fix)}


def clip(text: str, limit: int = SUMMARY_LIMIT) -> str:
    """At most `limit` characters, cut at a word and marked, never mid-word."""
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;·(") + "…"


def _condition_json(condition: Condition) -> dict[str, Any]:
    return {"package": condition.package, "events": [{e.kind: e.release} for e in condition.events]}


def _evidence_json(condition: Condition, store: Store) -> dict[str, Any]:
    events = []
    for event in condition.events:
        entry: dict[str, Any] = {event.kind: event.release, "records": event.records}
        if event.bound:
            entry["bound"] = event.bound
        else:
            entry["before"] = {"release": event.before, "records": event.before_records}
        if event.masked:
            entry["masked"] = event.masked
        if event.finding:  # its reproducer ran at both releases, every other pin held: evidence at each
            runs = _finding_runs(store.finding(event.finding))
            entry["finding"] = event.finding
            entry["records"] = entry["records"] or runs.get(event.release, [])
            if "before" in entry:
                entry["before"]["records"] = entry["before"]["records"] or runs.get(event.before or "", [])
        events.append(entry)
    return {"package": condition.package, "events": events}


def _finding_runs(finding: Finding) -> dict[str, list[dict[str, Any]]]:
    """release -> the finding's newest verification run at it: its reproducer's exit (1: the failure, 0: it holds)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for side, run in finding.runs.items():
        outcome = {1: "fail", 0: "pass"}.get(run.get("exit_code"), "no-evidence")
        found[str(run.get("version"))] = [
            {"finding": finding.id, "side": side, "outcome": outcome, "made_at": run.get("made_at"),
             "machine": run.get("machine") or {"gpus": 0}}
        ]  # fmt: skip
    return found


def _affected(failure: KnownFailure, table: dict[str, Any]) -> list[dict[str, Any]]:
    """OSV's affected[]: each condition package's events, a first bound opened at "0"; with no condition, the packages
    the upstream record names (else its scenario's last), open from "0" with no fix."""
    entries = []
    for condition in failure.conditions:
        events = [{e.kind: e.release} for e in condition.events]
        if condition.events[0].bound:  # the oldest release measured already fails: open below it
            events[0] = {"introduced": "0"}
        entries.append((condition.package, _ordered(events)))
    if not entries:
        named = sorted(upstream_packages(failure.signature) & set(failure.depends)) or failure.depends[-1:]
        entries = [(package, [{"introduced": "0"}]) for package in named]
    return [
        {"package": {"ecosystem": "PyPI", "name": p, "purl": f"pkg:pypi/{p}"},
         "ranges": [{"type": "ECOSYSTEM", "events": events}]}
        for p, events in entries
    ]  # fmt: skip


def _ordered(events: list[dict[str, str]]) -> list[dict[str, str]]:
    """OSV wants an `introduced` first: a range that opens with a fix gets `introduced: 0` before it."""
    return events if events and "introduced" in events[0] else [{"introduced": "0"}, *events]


def _first_shown(failure: KnownFailure) -> str:
    """When the failure was first shown: the earliest record showing it (else the earliest record of its configs)."""
    shown = [o.started_at for o in failure.observed if o.started_at and failure.state(o) == "shows"]
    return _osv_time(min(shown or [o.started_at for o in failure.observed if o.started_at] or [_now()]))


def _osv_time(stamp: str) -> str:
    """An RFC 3339 UTC time as OSV writes it (`...Z`), to the second."""
    when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    when = when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)
    return when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def settle(
    advisory: dict[str, Any], previous: dict[str, Any] | None, now: str | None = None, added: str | None = None
) -> dict[str, Any]:
    """The advisory with OSV's two times set against the one already published (`previous`, None where there is none)
    and the time its file was first committed (`added`, where the folder is a git checkout): `published` the earliest
    of the first record showing it, the published one and the first commit (set once: a growth adding records, or a
    record retired, never moves it later); `modified` the published one's while the content (everything but the two
    times) is the same, else `now` (the report that changed it)."""
    content = {k: v for k, v in advisory.items() if k not in _TIMES}
    first = min(advisory["published"], _osv_time(added)) if added else advisory["published"]
    if not previous or not all(isinstance(previous.get(k), str) for k in _TIMES):
        return advisory | {"published": first, "modified": max(_osv_time(now or _now()), first)}
    try:
        published = min(first, _osv_time(previous["published"]))
        kept = _osv_time(previous["modified"])
    except ValueError:  # a stamp that is no time: published anew
        return settle(advisory, None, now, added)
    same = content == {k: v for k, v in previous.items() if k not in _TIMES}
    modified = kept if same else _osv_time(now or _now())
    return advisory | {"published": published, "modified": max(modified, published)}


_TIMES = ("modified", "published")


def _details(failure: KnownFailure, table: dict[str, Any], where: str, off: list[float]) -> str:
    lines = [f"`{failure.signature}` {where}, measured by the compat-matrix atlas ({failure.scenario})."]
    for condition in failure.conditions:
        words = " · ".join(
            f"{'started' if e.kind == 'introduced' else 'ended'} with {condition.package} {e.release}"
            + (" (the oldest release measured)" if e.bound else "")
            for e in condition.events
        )
        lines.append(f"- {condition.package}: {words}")
    if not failure.conditions:
        lines.append(f"- {table['everywhere'] if failure.shape == 'everywhere' else _MIXED}")
    lines.append(f"Setups: {'; '.join(s['words'] for s in table['setups'])}.")
    if table["detail"]:
        lines.append(f"Applies if: {table['detail']}.")
    if table["measured_with"]:
        lines.append(f"Measured with: {table['measured_with']}.")
    for condition in failure.conditions:
        for event in condition.events:
            if event.masked:
                lines.append(f"Started with {condition.package} {event.release}: {event.masked}.")
    if off:
        lines.append(f"Off its float64 reference by {min(off):.2g}x to {max(off):.2g}x.")
    for fix in table["fixes"]:
        measured = fix_where(table, fix)
        lines.append(f"- {fix['kind']}: {fix['words']}: {measured} (`compat-matrix audit` judges it at your releases)")
    lines.append("`database_specific.conditions` holds the conjunction; `evidence` the records behind every event.")
    return "\n".join(lines)


_MIXED = "it shows on some stacks and passes on others, and no release is named between: only exact records decide"


def _references(failure: KnownFailure, configs: list[dict[str, Any]]) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    for issue in upstream(failure.signature, configs):
        repo, _, number = issue.partition("#")
        if number:
            found.append({"type": "REPORT", "url": f"https://github.com/{repo}/issues/{number}"})
    for change in failure.changes:
        state = "target" if change.direction == "started" else "not-reproduced"
        known = upstream_change(failure.signature, state, (change.package, change.release), configs)
        if known and known["package"] == change.package:
            found.append({"type": "WEB", "url": f"https://pypi.org/project/{change.package}/{known['release']}/"})
        if change.finding:
            found.append({"type": "EVIDENCE", "url": f"results/FINDINGS.md#{change.finding}"})
    return [ref for i, ref in enumerate(found) if ref not in found[:i]]


def read(folder: Path) -> list[dict[str, Any]]:
    """The advisories a folder's `index.json` lists, in its order (what `write` made)."""
    index = json.loads((folder / "index.json").read_text())
    return [json.loads((folder / entry["file"]).read_text()) for entry in index]


def read_tables(folder: Path) -> dict[str, Any]:
    """The judge's tables written beside the advisories."""
    return json.loads((folder / JUDGE_FILE).read_text())


def write(advisories: list[dict[str, Any]], tables: dict[str, Any], results_dir: Path) -> Path:
    """`results/advisories/<ID>.json` for each, `index.json` (id, summary, packages, modified), `judge.json`, and
    nothing else (an advisory no longer made is removed, so the feed never serves one the records no longer back)."""
    folder = results_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    keep = {f"{a['id']}.json" for a in advisories} | {"index.json", JUDGE_FILE}
    for stale in folder.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
    now, added = _now(), first_committed(folder)
    advisories = [
        settle(a, _published(folder / f"{a['id']}.json"), now, added.get(f"{a['id']}.json")) for a in advisories
    ]
    for advisory in advisories:
        _write_if_changed(folder / f"{advisory['id']}.json", json.dumps(advisory, indent=1) + "\n")
    index = [
        {"id": a["id"], "summary": a["summary"], "modified": a["modified"],
         "packages": [x["package"]["name"] for x in a["affected"]], "file": f"{a['id']}.json"}
        for a in advisories
    ]  # fmt: skip
    _write_if_changed(folder / "index.json", json.dumps(index, indent=1) + "\n")
    _write_if_changed(folder / JUDGE_FILE, json.dumps(tables, sort_keys=True, separators=(",", ":")) + "\n")
    return folder


def _published(path: Path) -> dict[str, Any] | None:
    """The advisory already in the folder (the committed one), or None where there is none or it does not read."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def first_committed(folder: Path) -> dict[str, str]:
    """File name -> when git first added it to the folder (its committer time, UTC), for a folder in a git checkout;
    empty elsewhere (a copy, a tarball, no git): the records and the published files then decide alone."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "log", "--diff-filter=A", "--format=%x00%cI", "--name-only", "--", "."],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    when = ""
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        if line.startswith("\0"):
            when = _osv_time(line[1:].strip())
        elif line.strip() and when:
            name = line.strip().rsplit("/", 1)[-1]
            found[name] = min(found.get(name, when), when)
    return found


def _write_if_changed(path: Path, text: str) -> None:
    """Write only a changed file: an unchanged one keeps its bytes and its time on disk."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)
