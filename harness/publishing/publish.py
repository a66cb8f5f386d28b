"""Publish the records beyond Markdown: `results/matrix.json`, a static site, JUnit XML per run, and what
changed since the previous published run.

Everything is derived from the same selection of records as COMPATIBILITY.md. Text that comes from
exceptions is never interpreted as markup: the site embeds the data as JSON with `<` escaped and builds
every element with textContent; JUnit text goes through the XML library.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.knowledge.atlas import Atlas
from harness.knowledge.selection import Selection, retired, same_code
from harness.publishing.glance import (
    SYMBOLS_LEGEND,
    entry_lines,
    glance_tables,
    glance_text,
    pick_options,
    pitfall_rows,
)
from harness.recording.outcomes import BAD
from harness.recording.records import record_key
from harness.textsafe import code, md, slug

SCHEMA = "compat-matrix/matrix/v1"
SITE_TEMPLATE = Path(__file__).with_name("site_template.html")
SITE_READ = Path(__file__).with_name("site_read.js")  # audit.py's readers, for the page
SITE_CONFIG = Path(__file__).with_name("site_config.js")  # user_files.py's config readers, for the page
SITE_JUDGE = Path(__file__).with_name("site_judge.js")  # the judge's fold over the compiled tables, for the page
MESSAGE_LIMIT = 1500
VERSION_KEYS = ("python", *AXIS_PACKAGES)


def build_matrix(atlas: Atlas, repro_index: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The document behind matrix.json and the site (schema: docs/matrix-json.md); the glance and the pitfalls are
    views of the atlas's judge."""
    specs = atlas.specs
    selection = atlas.selection
    records, flaky = selection.latest()
    pitfalls = atlas.pitfalls
    repro_by_failure = {
        (e["cell"], e["scenario"], e["variant"], e["signature"]): e["file"] for e in (repro_index or [])
    }
    slim = []
    for record in sorted(records, key=lambda r: record_key(r)):
        slim.append(
            {
                "key": list(record_key(record)),
                "run_id": record.get("run_id"),
                "cell": record["cell"],
                "scenario": record["scenario"],
                "variant": record["variant"],
                "config_id": record["config_id"],
                "config_source": record.get("config_source"),
                "config": record.get("config"),
                "minimal_config": record.get("minimal_config"),
                "outcome": record["outcome"],
                "signature": record.get("signature"),
                "known_issue": record.get("known_issue") or [],
                "message": (record.get("message") or "")[:MESSAGE_LIMIT],
                "metrics": record.get("metrics") or {},
                "versions": {k: v for k, v in (record.get("versions") or {}).items() if k in VERSION_KEYS},
                "device": (record.get("hardware") or {}).get("device"),
                "gpu": (record.get("hardware") or {}).get("gpu_name"),
                "world_size": (record.get("hardware") or {}).get("world_size"),
                "flaky": record_key(record) in flaky,
                "repro": repro_by_failure.get(
                    (record["cell"], record["scenario"], record["variant"], record.get("signature"))
                ),
            }
        )
    return {
        "schema": SCHEMA,
        # The data's time, not the clock's: a report from the same records writes the same document.
        "generated_at": max((str(r.get("started_at") or "") for r in records), default="") or None,
        "runs": [
            {k: meta.get(k) for k in ("run_id", "profile", "started_at", "finished_at", "status", "harness_commit")}
            | {"hardware": meta.get("hardware")}
            for meta in selection.metas
        ],
        "packages": list(AXIS_PACKAGES),
        "entries": matrix_entries(atlas),
        "scenarios": {
            sid: {
                "title": spec.get("title", ""),
                "target": list(spec.get("target") or []),
                "controls": list(spec.get("controls") or []),
                "variants": {name: {"kind": v[0], "description": v[1]} for name, v in spec["variants"].items()},
            }
            for sid, spec in sorted(specs.items())
            if any(r["scenario"] == sid for r in records)
        },
        "records": slim,
        "flaky_keys": sorted(list(k) for k in flaky),
        "glance": glance_tables(atlas),
        "pitfalls": pitfall_rows(pitfalls, specs),
    }


def matrix_entries(atlas: Atlas) -> list[dict[str, Any]]:
    """One per row (a stack that ran) and scenario with a record there: the atlas's entry (`Atlas.entries`, the fold
    the glance shows), with its baseline outcomes, its verdict's lines and the keys of the records it counted (the
    row's own and any run's at exactly its releases; pitfall configs left out, listed apart)."""
    found = []
    for row, label, entries in zip(atlas.rows, atlas.row_labels, atlas.entries, strict=True):
        for one in entries:
            if not one.ran:
                continue
            spec = atlas.specs.get(one.scenario)
            baseline = dict(Counter(r["outcome"] for r in one.records if r["variant"] == "baseline"))
            verdict = one.verdict
            found.append({
                "cell": row.cell,
                "row": label,
                "scenario": one.scenario,
                "baseline": baseline,
                "state": _state(baseline),
                "records": len(one.records),
                "keys": sorted("|".join(record_key(r)) for r in one.records),
                "target": {
                    "state": one.state,
                    "reproduced_on": len(verdict.target_records) if verdict else 0,
                    "of": verdict.candidates if verdict else 0,
                },
                "headline": entry_lines(one, spec),
                "glance": glance_text(atlas, one),
                "judged": one.judged,
                "pitfalls": one.pitfalls,
            })  # fmt: skip
    return sorted(found, key=lambda e: (e["cell"], e["row"], e["scenario"]))


def _state(baseline: dict[str, int]) -> str:
    if not baseline:
        return "none"
    if any(o in BAD for o in baseline):
        return "fail" if not baseline.get("pass") else "mixed"
    if baseline.get("pass"):
        return "pass"
    return "skip"


def changes_since_previous(atlas: Atlas) -> dict[str, list[dict[str, Any]]]:
    """Baseline outcomes that changed against the previous run of each selected run's profile."""
    metas = atlas.store.metas
    newly_failing, newly_fixed = [], []
    for meta in atlas.selection.metas:
        older = sorted(
            (
                m
                for m in metas.values()
                if m.get("profile") == meta.get("profile")
                and m.get("started_at", "") < meta.get("started_at", "")
                and not retired(m)
            ),
            key=lambda m: m.get("started_at", ""),
        )
        if not older:
            continue
        previous = older[-1]
        before = {
            record_key(r): r
            for r in atlas.store.run_records(previous["run_id"], warn=False)
            if r["variant"] == "baseline"
        }
        for record in atlas.store.run_records(meta["run_id"], warn=False):
            earlier = before.get(record_key(record))
            if record["variant"] != "baseline" or earlier is None:
                continue
            if not same_code((previous, earlier), (meta, record)):
                continue  # the scenario itself changed between the runs: not a change of the stack
            old = earlier["outcome"]
            item = {
                "cell": record["cell"],
                "scenario": record["scenario"],
                "config_id": record["config_id"],
                "before": old,
                "after": record["outcome"],
                "signature": record.get("signature"),
                "previous_run": previous["run_id"],
                "run": meta["run_id"],
            }
            if old == "pass" and record["outcome"] in BAD:
                newly_failing.append(item)
            elif old in BAD and record["outcome"] == "pass":
                newly_fixed.append(item)
    return {"newly_failing": newly_failing, "newly_fixed": newly_fixed}


def changes_markdown(changes: dict[str, list[dict[str, Any]]]) -> str:
    """The Markdown section: baselines newly failing / newly fixed against each profile's previous run."""
    lines = [
        "## Changed since the previous run",
        "",
        "Baseline outcomes against each profile's previous run, where both ran the same scenario code (a change of"
        " the scenario itself is not a change of the stack).",
        "",
    ]
    for title, items in (("Newly failing", changes["newly_failing"]), ("Newly fixed", changes["newly_fixed"])):
        lines.append(f"**{title}:** " + ("none" if not items else f"{len(items)}"))
        lines += [
            f"- {code(c['cell'])} {md(c['scenario'])} config {code(c['config_id'])}: {md(c['before'])} -> "
            f"{md(c['after'])}"
            + (f" {code(c['signature'])}" if c.get("signature") else "")
            + f" (run {code(c['run'])}, before: {code(c['previous_run'])})"
            for c in items
        ]
        lines.append("")
    return "\n".join(lines)


def write_junit(selection: Selection, out_dir: Path) -> list[Path]:
    """One JUnit file per run: a testsuite per cell x scenario, a testcase per record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for run_id in selection.run_ids:
        records = [r for r in selection.records if r.get("run_id") == run_id]
        suites = ET.Element("testsuites", name=run_id)
        grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for record in records:
            grouped[(record["cell"], record["scenario"])].append(record)
        for (cell, scenario), group in sorted(grouped.items()):
            failures = sum(1 for r in group if r["outcome"] == "fail")
            errors = sum(1 for r in group if r["outcome"] in BAD and r["outcome"] != "fail")
            skipped = sum(1 for r in group if r["outcome"] in ("skip", "install-failed"))
            suite = ET.SubElement(
                suites,
                "testsuite",
                name=f"{cell}/{scenario}",
                tests=str(len(group)),
                failures=str(failures),
                errors=str(errors),
                skipped=str(skipped),
            )
            for record in group:
                case = ET.SubElement(
                    suite,
                    "testcase",
                    classname=f"{cell}.{scenario}",
                    name=f"{record['variant']}[{record['config_id']}]",
                    time=str(record.get("duration_s") or 0),
                )
                outcome = record["outcome"]
                if outcome == "fail":
                    node = ET.SubElement(case, "failure", message=record.get("signature") or "", type=outcome)
                    node.text = record.get("message") or ""
                elif outcome in BAD:
                    node = ET.SubElement(case, "error", message=record.get("signature") or "", type=outcome)
                    node.text = record.get("message") or ""
                elif outcome in ("skip", "install-failed"):
                    ET.SubElement(case, "skipped", message=(record.get("message") or "")[:300])
        path = out_dir / f"{slug(run_id, 120)}.xml"
        ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
        written.append(path)
    return written


def write_site(document: dict[str, Any], out_dir: Path, advisories_dir: Path | None = None) -> Path:
    """A small page and its data beside it: `data/glance.js` (the answer grid, loaded first), `data/judge.js` (the
    judge's tables the page's answer looks versions up in) and `data/matrix.js` (every record, loaded once the grid is
    on screen). No external resources; works from file://, where a browser refuses fetch(), so the data are script
    files that assign one JSON object each."""
    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    glance = {
        "packages": document.get("packages", []),
        "tables": document.get("glance", []),
        "pick_options": pick_options(document.get("glance", []), document.get("packages", [])),
        "legend": SYMBOLS_LEGEND + " Click an entry for its records.",
        "findings": document.get("findings", []),
        "pitfalls": document.get("pitfalls", []),
        "lately": document.get("lately") or {},
        "adapter_grid": document.get("adapter_grid"),
        "generated_at": document.get("generated_at"),
    }
    (data_dir / "glance.js").write_text(f"window.COMPAT_GLANCE = {_script_json(glance)};\n")
    (data_dir / "matrix.js").write_text(f"window.COMPAT_DATA = {_script_json(document)};\n")
    write_site_tables(advisories_dir, out_dir)
    (out_dir / "read.js").write_text(SITE_READ.read_text())
    (out_dir / "config.js").write_text(SITE_CONFIG.read_text())
    (out_dir / "judge.js").write_text(SITE_JUDGE.read_text())
    path = out_dir / "index.html"
    path.write_text(SITE_TEMPLATE.read_text())
    return path


def write_site_tables(advisories_dir: Path | None, site_dir: Path) -> None:
    """data/judge.js: the judge's tables written beside the advisories, which the page's answer looks versions up in;
    empty tables where there is no feed yet."""
    from harness.publishing.advisories import JUDGE_FILE, read_tables

    found = advisories_dir and (advisories_dir / JUDGE_FILE).is_file()
    tables = read_tables(advisories_dir) if found else {"failures": [], "pitfalls": [], "releases": {}}  # type: ignore[arg-type]
    (site_dir / "data").mkdir(parents=True, exist_ok=True)
    (site_dir / "data" / "judge.js").write_text(f"window.COMPAT_JUDGE = {_script_json(tables)};\n")
    (site_dir / "data" / "advisories.js").unlink(missing_ok=True)


def _script_json(value: Any) -> str:
    """JSON that cannot end the script it sits in or open markup (record messages are arbitrary text)."""
    text = json.dumps(value, sort_keys=True)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def publish(atlas: Atlas, repro_index: list[dict[str, Any]]) -> dict[str, Path]:
    """matrix.json, site/index.html and junit/<run>.xml next to COMPATIBILITY.md; `repro_index`: the reproducers
    just written (results/repros/index.json)."""
    results_dir = atlas.results_dir
    document = build_matrix(atlas, repro_index)
    document["changes"] = changes_since_previous(atlas)
    from harness.publishing.findings import findings_rows

    document["findings"] = findings_rows(atlas.store)
    from harness.publishing.growth import lately

    document["lately"] = lately(atlas)
    from harness.publishing.adapter_grid import document as adapter_grid_document

    document["adapter_grid"] = adapter_grid_document(atlas.store)
    matrix_path = results_dir / "matrix.json"
    # Compact: an indented 18 MB document goes through json's pure-Python encoder (4 s of a report); `python -m
    # json.tool results/matrix.json` shows it indented.
    matrix_path.write_text(json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n")
    site = write_site(document, results_dir / "site")  # its data/advisories.js: stage.write_advisories, after them
    write_junit(atlas.selection, results_dir / "junit")
    return {"matrix": matrix_path, "site": site, "junit": results_dir / "junit"}
