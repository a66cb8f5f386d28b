"""Advisories that tools can read: what the atlas knows about each version failure, in the OSV format that pip-audit,
osv-scanner and dependency bots read (`results/advisories/<ID>.json`, `index.json`), made with the table from the same
knowledge `lookup` answers from (`knowledge.py`), never by hand.

One advisory per failure of one scenario on one device class whose configs share the same changes (the flips,
sweeps and verified findings that name a release): its OSV `affected[]` has one entry per package a change names,
with `ECOSYSTEM` ranges of `introduced` / `fixed` events at the releases the records show. OSV reads `affected[]` as
"any of these": where one package brings a failure and another ends it (S9 resume under FSDP2: transformers 5.14.1
brings it, accelerate 1.15.0 ends it), a stack that matches either entry is reported, so a tool reading only OSV
fields never calls an affected stack clean (it may report a stack the conjunction would clear). The conjunction is in
`database_specific.conditions`, which `compat-matrix audit` reads.

The evidence rule holds for every event: its `database_specific.evidence` names records at exactly that release
(run id, config, outcome) and at the release before it. Where a failure already shows on the oldest release measured,
its first `introduced` event in `conditions` is that release, marked `"bound": "earliest measured"` (the releases below
it were not measured with the failure's other conditions: `audit` says undecided there), and OSV's `affected[]` opens
it at `"0"`, so a tool reading only OSV fields never calls those older releases clean.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.define import setup as vocabulary
from harness.define.packages import public_version
from harness.knowledge import flips as knowledge
from harness.knowledge.evidence import device_class
from harness.recording.flip import Flip
from harness.recording.verdicts import variant_kinds
from scenarios.failure_names import family as failure_family
from scenarios.failure_names import upstream, upstream_change
from scenarios.fix_words import fix_words

SCHEMA_VERSION = "1.7.0"
#: OSV's prefix for a database of one's own (`x_`), and this project's name after it.
PREFIX = "x_COMPAT-MATRIX"
FOLDER = "advisories"


def _key(version: str | None) -> tuple[int, ...]:
    return Version(public_version(version or "0") or "0").release


def build(
    records: list[dict[str, Any]],
    probes: list[dict[str, Any]],
    flips: list[Flip],
    specs: dict[str, dict[str, Any]],
    results_dir: Path,
) -> list[dict[str, Any]]:
    """Every advisory, from the table's records, the probes, the table's flips (masked ones left out by the caller)
    and the verified findings."""
    run_atlas = knowledge.atlas_of_runs(records)
    changes = knowledge.changes_for(flips, run_atlas) + knowledge.finding_changes(results_dir)
    signature_of = {(f.scenario, tuple(f.config_ids)): f.signature for f in flips}
    everything = [*records, *probes]
    groups: dict[tuple[Any, ...], list[knowledge.Change]] = defaultdict(list)
    for change in changes:
        groups[(change.scenario, change.device, change.config_ids, failure_family(change.signature))].append(change)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for (scenario, device, config_ids, _), found in _joined(groups).items():
        events = tuple(sorted({(c.package, c.release, c.direction) for c in found}, key=lambda e: (e[0], _key(e[1]))))
        signature = found[0].signature or signature_of.get((scenario, config_ids)) or next(
            (r.get("signature") for r in everything if r["scenario"] == scenario and r["config_id"] in config_ids
             and r["outcome"] == "fail" and r.get("signature")), None,
        )  # fmt: skip
        key = (scenario, device, failure_family(signature), events)
        entry = merged.setdefault(key, {"changes": [], "configs": set(), "signature": signature})
        entry["changes"] += found
        entry["configs"] |= set(config_ids)
    return [
        _advisory(scenario, device, entry, everything, specs, results_dir)
        for (scenario, device, _, _), entry in sorted(
            merged.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][3]))
        )
    ]


def _joined(groups: dict[tuple[Any, ...], list[knowledge.Change]]) -> dict[tuple[Any, ...], list[knowledge.Change]]:
    """Changes of one failure whose configs overlap, as one group: where torch 2.5.0 brought S4's failure on some
    configs and deepspeed 0.19.3 ended it on them, one advisory holds both (torch >= 2.5.0 and deepspeed < 0.19.3),
    never one saying torch alone still fails while the other says deepspeed ended it."""
    keys = list(groups)
    parent = list(range(len(keys)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (scenario, device, configs, family) in enumerate(keys):
        for j in range(i):
            other = keys[j]
            if (scenario, device, family) == (other[0], other[1], other[3]) and set(configs) & set(other[2]):
                parent[root(i)] = root(j)
    joined: dict[tuple[Any, ...], list[knowledge.Change]] = {}
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(len(keys)):
        members[root(i)].append(i)
    for indices in members.values():
        first = keys[indices[0]]
        configs = tuple(sorted({c for i in indices for c in keys[i][2]}))
        joined[(first[0], first[1], configs, first[3])] = [c for i in indices for c in groups[keys[i]]]
    return joined


def _advisory(
    scenario: str,
    device: str,
    entry: dict[str, Any],
    records: list[dict[str, Any]],
    specs: dict[str, dict[str, Any]],
    results_dir: Path,
) -> dict[str, Any]:
    spec = specs.get(scenario) or {}
    family = failure_family(entry["signature"])
    on_device = [r for r in records if r["scenario"] == scenario and device_class(r) == device]
    # A flip stored without its configs stands for the configs whose records show its failure there.
    configs = sorted(entry["configs"]) or sorted(
        {r["config_id"] for r in on_device if r["outcome"] == "fail" and failure_family(r.get("signature")) == family}
    )
    mine = [r for r in on_device if r["config_id"] in configs]
    by_package: dict[str, list[knowledge.Change]] = defaultdict(list)
    for change in entry["changes"]:
        by_package[change.package].append(change)
    affected, conditions, evidence = [], [], []
    for package, changes in sorted(by_package.items()):
        findings = {(c.release, c.direction): c.finding for c in changes if c.finding}
        ordered = sorted({(c.release, c.direction, c.last_before) for c in changes}, key=lambda c: _key(c[0]))
        events: list[dict[str, str]] = []
        notes: list[dict[str, Any]] = []
        if ordered and ordered[0][1] == "ended":
            earliest = _earliest_failing(mine, package, family)
            if earliest:
                events.append({"introduced": earliest})
                notes.append({"introduced": earliest, "bound": "earliest measured",
                              "records": _records_at(mine, package, earliest, "fail", family)})  # fmt: skip
        for release, direction, before in ordered:
            kind = "introduced" if direction == "started" else "fixed"
            if events and kind in events[-1]:
                continue  # two configs' flips naming the same direction twice: the first stands
            events.append({kind: release})
            shows, showed = ("fail", "pass") if kind == "introduced" else ("pass", "fail")
            at = _records_at(mine, package, release, shows, family)
            note = {
                kind: release,
                "records": at,
                "before": {"release": before, "records": _records_at(mine, package, before, showed, family)},
            }
            finding = findings.get((release, direction))
            if finding:  # its reproducer ran at both releases, every other pin held: evidence at each
                note["finding"] = finding
                runs = _finding_runs(results_dir / "findings" / finding)
                note["records"] = note["records"] or runs.get(release, [])
                note["before"]["records"] = note["before"]["records"] or runs.get(before or "", [])
            notes.append(note)
        if not events or "introduced" not in events[0]:
            events.insert(0, {"introduced": "0"})
            notes.insert(
                0, {"introduced": "0", "bound": "not measured: no release before the fix was recorded failing"}
            )
        # OSV's fields alone: a failure first seen at the oldest release measured with it is open below it (the
        # releases below were never measured with its other conditions), so a tool reading only OSV never calls such
        # a stack clean; `conditions` keeps the measured bound, below which `audit` says undecided.
        bounded = bool(notes) and notes[0].get("bound") == "earliest measured"
        published = [{"introduced": "0"}, *events[1:]] if bounded else events
        affected.append({
            "package": {"ecosystem": "PyPI", "name": package, "purl": f"pkg:pypi/{package}"},
            "ranges": [{"type": "ECOSYSTEM", "events": published}],
        })  # fmt: skip
        conditions.append({"package": package, "events": events})
        evidence.append({"package": package, "events": notes})
    base = [r for r in mine if r["variant"] == "baseline"]
    apart = _apart(scenario, on_device, configs)
    setups = sorted({vocabulary.config_words(r.get("config"), spec) + apart.get(r["config_id"], "") for r in base})
    keys = sorted(
        {json.dumps(vocabulary.narrowing(vocabulary.setup_of(r.get("config"), spec)), sort_keys=True) for r in base}
    )
    signature = entry["signature"]
    off = [float(x) for r in mine if isinstance(x := (r.get("metrics") or {}).get("off_by"), int | float)
           and r["outcome"] == "fail"]  # fmt: skip
    advisory_id = _id(scenario, device, signature, configs)
    title = str(spec.get("title") or scenario).split(": ", 1)[-1]
    where = "on GPUs" if device == "cuda" else "on CPU"
    summary = f"{scenario}: {title} ({where}, {'; '.join(setups) or 'the seed setup'})"
    ranks = sorted({int((r.get("hardware") or {}).get("world_size") or 1) for r in mine})
    return {
        "schema_version": SCHEMA_VERSION,
        "id": advisory_id,
        "modified": _newest(mine),
        "published": _newest(mine),
        "summary": summary[:200],
        "details": _details(scenario, signature, by_package, setups, off, where),
        "affected": affected,
        "references": _references(scenario, signature, results_dir, entry["changes"]),
        "database_specific": {
            "scenario": scenario,
            "failure": signature,
            "device": device,
            "world_size": ranks,
            "setups": setups,
            "setup_keys": [json.loads(k) for k in keys],
            "config_ids": configs,
            "conditions": conditions,
            "conditions_are": "all of: every package's events hold together (OSV's affected[] is any of them)",
            "held": _held(mine, set(by_package)),
            "workarounds": _workarounds(mine, spec),
            "off_by": [min(off), max(off)] if off else None,
            # The releases of each package the records of these configs ran on (where the atlas can decide).
            "measured": {p: _measured(mine, p) for p in sorted(by_package)},
            "evidence": evidence,
        },
    }


def _id(scenario: str, device: str, signature: str | None, configs: list[str]) -> str:
    digest = hashlib.sha256(json.dumps([scenario, device, failure_family(signature), configs]).encode()).hexdigest()
    return f"{PREFIX}-{scenario.split('-')[0]}-{device}-{digest[:10]}"


def _earliest_failing(records: list[dict[str, Any]], package: str, family: str) -> str | None:
    """The oldest release of `package` a record of these configs showed this failure on (their baseline)."""
    failing = [
        r for r in records
        if r["variant"] == "baseline" and r["outcome"] == "fail" and failure_family(r.get("signature")) == family
    ]  # fmt: skip
    releases = {str(public_version(str((r.get("versions") or {}).get(package) or ""))) for r in failing}
    releases.discard("")
    releases.discard("None")
    return min(releases, key=_key) if releases else None


def _records_at(
    records: list[dict[str, Any]], package: str, release: str | None, shows: str, family: str
) -> list[dict[str, Any]]:
    """Up to three baseline records of these configs at exactly `release` of `package`, those with the outcome the
    event claims there (`shows`: "fail" where it brought the failure, "pass" where it ended it) first: the evidence."""
    if not release:
        return []
    found = [
        {"run_id": r.get("run_id"), "config_id": r["config_id"], "outcome": r["outcome"], "cell": r["cell"]}
        # a failure names its signature: before an onset, another failure is no evidence of this one
        | ({"signature": r["signature"]} if r["outcome"] == "fail" and r.get("signature") else {})
        for r in records
        if r["variant"] == "baseline"
        and str(public_version(str((r.get("versions") or {}).get(package) or ""))) == release
    ]

    def order(e: dict[str, Any]) -> tuple[bool, bool, str, str]:
        this = failure_family(e.get("signature")) == family
        return e["outcome"] != shows, this != (shows == "fail"), str(e["run_id"]), e["config_id"]

    found.sort(key=order)
    return found[:3]


def _apart(scenario: str, records: list[dict[str, Any]], configs: list[str]) -> dict[str, str]:
    """config id -> ' with smoothing=0.1': what sets an advisory's config apart from the scenario's usual one (each key
    whose value differs from the one most of the scenario's configs have), where it is not a setup key."""
    every = {r["config_id"]: r.get("config") or {} for r in records if r["variant"] == "baseline"}
    common: dict[str, str] = {}
    for key in {k for c in every.values() for k in c}:
        values = [json.dumps(c.get(key), sort_keys=True) for c in every.values()]
        common[key] = max(sorted(set(values)), key=values.count)  # a tie goes the same way in every process
    found = {}
    for config_id in configs:
        own = every.get(config_id, {})
        odd = [f"{k}={own[k]}" for k in sorted(own) if not vocabulary.is_setup_key(k)
               and json.dumps(own[k], sort_keys=True) != common.get(k)]  # fmt: skip
        found[config_id] = f" with {', '.join(odd)}" if 0 < len(odd) <= 3 else ""
    return found


def _finding_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """release -> the finding's newest verification run at it, as evidence: its reproducer's exit (1: the failure,
    0: it holds) with the versions its processes imported."""
    from harness.knowledge.findings import load_finding

    finding = load_finding(folder)
    found: dict[str, list[dict[str, Any]]] = {}
    for side, run in finding.runs.items():
        outcome = {1: "fail", 0: "pass"}.get(run.get("exit_code"), "no-evidence")
        found[str(run.get("version"))] = [
            {"finding": finding.id, "side": side, "outcome": outcome, "made_at": run.get("made_at"),
             "machine": run.get("machine") or {"gpus": 0}}
        ]  # fmt: skip
    return found


def _measured(records: list[dict[str, Any]], package: str) -> list[str]:
    """The releases of `package` the baseline records of these configs ran on."""
    found = {str(public_version(str((r.get("versions") or {}).get(package) or ""))) for r in records
             if r["variant"] == "baseline" and r["outcome"] in ("pass", "fail")}  # fmt: skip
    return sorted((v for v in found if v not in ("", "None")), key=_key)


def _held(records: list[dict[str, Any]], moved: set[str]) -> dict[str, list[str]]:
    """The other packages' releases in the records behind the advisory (what held while its events were measured)."""
    from harness.define.packages import AXIS_PACKAGES

    held: dict[str, set[str]] = defaultdict(set)
    for record in records:
        for package in AXIS_PACKAGES:
            version = (record.get("versions") or {}).get(package)
            if version and package not in moved:
                held[package].add(str(public_version(str(version))))
    return {p: sorted(v, key=_key) for p, v in sorted(held.items())}


def _workarounds(records: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, str]]:
    """The variants that passed on these configs where their baseline failed, as the scenario describes them."""
    failing = {(r["cell"], r["config_id"]) for r in records if r["variant"] == "baseline" and r["outcome"] == "fail"}
    passed = sorted({r["variant"] for r in records if r["variant"] != "baseline" and r["outcome"] == "pass"
                     and (r["cell"], r["config_id"]) in failing})  # fmt: skip
    kinds = variant_kinds(spec)
    described = {name: value[1] for name, value in (spec.get("variants") or {}).items()}
    settings = spec.get("variant_setup") or {}
    return [
        {"variant": v, "kind": kinds.get(v, "fix"), "words": fix_words(v), "what": described.get(v, "")}
        # the setting a user's config can already have (SPEC variant_setup): audit clears the advisory for it
        | ({"setup": dict(settings[v])} if v in settings else {})
        for v in passed
    ]


def _newest(records: list[dict[str, Any]]) -> str:
    """The newest record's time (a stable stamp: regenerating the advisory from the same records gives the same)."""
    stamps = [str(r.get("finished_at") or r.get("started_at") or r.get("timestamp") or "") for r in records]
    stamps = [s for s in stamps if s]
    newest = max(stamps) if stamps else "2026-11-27T00:00:00Z"
    return newest if newest.endswith("Z") else newest.replace("+00:00", "Z")


def _details(
    scenario: str, signature: str | None, by_package: dict[str, list[knowledge.Change]], setups: list[str],
    off: list[float], where: str,
) -> str:  # fmt: skip
    lines = [f"`{signature}` {where}, measured by the compat-matrix atlas ({scenario})."]
    for package, changes in sorted(by_package.items()):
        words = " · ".join(
            f"{c.direction} with {package} {c.release}" for c in sorted(changes, key=lambda c: _key(c.release))
        )
        lines.append(f"- {package}: {words}")
    if setups:
        lines.append(f"Setups: {'; '.join(setups)}.")
    if off:
        lines.append(f"Off its float64 reference by {min(off):.2g}x to {max(off):.2g}x.")
    lines.append("`database_specific.conditions` holds the conjunction; `evidence` the records behind every event.")
    return "\n".join(lines)


def _references(
    scenario: str, signature: str | None, results_dir: Path, changes: list[knowledge.Change]
) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    for issue in upstream(signature):
        repo, _, number = issue.partition("#")
        if number:
            found.append({"type": "REPORT", "url": f"https://github.com/{repo}/issues/{number}"})
    for change in changes:
        known = upstream_change(signature, "target" if change.direction == "started" else "not-reproduced",
                                (change.package, change.release))  # fmt: skip
        if known and known["package"] == change.package:
            found.append({"type": "WEB", "url": f"https://pypi.org/project/{change.package}/{known['release']}/"})
    for path in sorted((results_dir / "findings").glob("*/finding.toml")):
        if (
            path.parent.name.startswith(tuple(f"{c.package}-{c.release}" for c in changes))
            and scenario in path.read_text()
        ):
            found.append({"type": "EVIDENCE", "url": f"results/FINDINGS.md#{path.parent.name}"})
    unique = []
    for ref in found:
        if ref not in unique:
            unique.append(ref)
    return unique


def read(folder: Path) -> list[dict[str, Any]]:
    """The advisories a folder's `index.json` lists, in its order (what `write` made): audit's input and the page's."""
    index = json.loads((folder / "index.json").read_text())
    return [json.loads((folder / entry["file"]).read_text()) for entry in index]


def write(advisories: list[dict[str, Any]], results_dir: Path) -> Path:
    """`results/advisories/<ID>.json` for each, an `index.json` (id, summary, packages, modified), and nothing else
    (an advisory no longer made is removed, so the feed never serves one the records no longer back)."""
    folder = results_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    keep = {f"{a['id']}.json" for a in advisories} | {"index.json"}
    for stale in folder.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
    for advisory in advisories:
        (folder / f"{advisory['id']}.json").write_text(json.dumps(advisory, indent=1) + "\n")
    index = [
        {"id": a["id"], "summary": a["summary"], "modified": a["modified"],
         "packages": [x["package"]["name"] for x in a["affected"]], "file": f"{a['id']}.json"}
        for a in advisories
    ]  # fmt: skip
    (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return folder
