"""The report stage: from the selected runs' records to everything published (COMPATIBILITY.md, reproducers,
matrix.json, the site, JUnit, pictures). Run after every matrix and by `compat-matrix report`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.paths import DECLARED_FILE, RESULTS_DIR


class NothingToReport(UsageError):
    """No run holds a record yet (e.g. a run interrupted before its first record)."""


def write_report(results_dir: Path, run_ids: list[str] | None, output: Path | None) -> Path:
    """The table, site, JSON, JUnit and reproducers from the selected runs; an unwritable target is bad input."""
    try:
        return _write_all(results_dir, run_ids, output)
    except OSError as exc:
        where = exc.filename or output or results_dir
        raise UsageError(f"cannot write the report to {where}: {exc.strerror or exc}") from None


def _write_all(results_dir: Path, run_ids: list[str] | None, output: Path | None) -> Path:
    """Every output from one atlas: each results file is read once, by its store, whatever view asks."""
    from harness.define.registry import discover
    from harness.knowledge.atlas import Atlas
    from harness.publishing.report import render_markdown

    known = discover()
    specs = {s.id: s.spec for s in known}
    atlas = Atlas(results_dir, specs, run_ids)
    selection = atlas.selection
    if not selection.run_ids:
        raise NothingToReport(f"no records under {atlas.store.runs_root}; run `nox -s matrix` first")
    text = render_markdown(selection, specs, atlas)
    from harness.publishing.growth import lately, lately_markdown

    recent = lately(atlas) if run_ids is None else {}
    if recent:  # on top of the glance: the newest atlas day's changes and the newest release watch
        head = "## The answer at a glance"
        text = text.replace(head, "\n".join(lately_markdown(recent)) + "\n" + head, 1) if head in text else text
    from harness.publishing.publish import changes_markdown, changes_since_previous

    text += changes_markdown(changes_since_previous(atlas))
    from harness.knowledge.flips import dated_by_device
    from harness.publishing.atlas import atlas_words, flips_markdown, held_torch
    from harness.publishing.device_compare import disagreements_markdown

    dated = dated_by_device(atlas.table)
    # The selected runs' flips, their masking decided once by the atlas (a run the table no longer shows: none).
    flips = [f for f in atlas.flips if f.run_id in set(selection.run_ids)]
    flips_of = {device: [f for f in flips if f.run_id in {r["run_id"] for r in rs}] for device, rs in dated.items()}
    for device, records in dated.items():
        fixed = held_torch(records)
        where = (
            "the history run"
            if device == "cpu"
            else f"the GPU history run {atlas_words(device)} (torch fixed at {fixed or '?'})"
        )
        text += flips_markdown(flips_of[device], records, specs, where)
    for device in [d for d in dated if d.startswith("cuda")]:
        text += disagreements_markdown(dated.get("cpu", []), dated[device], specs, atlas_words(device))
    output = output or results_dir / "COMPATIBILITY.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if output == results_dir / "COMPATIBILITY.md":
        _write_beside(atlas, known, dated, flips_of)
    return output


def _write_beside(
    atlas: Any, known: list[Any], dated: dict[str, list[dict[str, Any]]], flips_of: dict[str, list[Any]]
) -> None:
    """What the full report writes beside COMPATIBILITY.md: reproducers, matrix.json and the site, pictures,
    FINDINGS.md, the advisories and ADAPTER-GRID.md, all from the same atlas."""
    from harness.publishing.publish import publish
    from harness.publishing.repro import sync_repros

    results_dir, specs = atlas.results_dir, atlas.specs
    _, repro_index = sync_repros(atlas.selection.records, {s.id: s for s in known}, results_dir / "repros")
    publish(atlas, repro_index)
    from harness.publishing.plots import plot_real_size
    from harness.publishing.report import real_size_rows

    plot_real_size(real_size_rows(atlas.table), results_dir / "s5-real-size.png")
    from harness.publishing.atlas import plot_s5_history, plot_timeline

    for device, records in dated.items():
        # cpu: history-timeline.png; cuda: gpu-history-timeline.png; cuda-ws2: gpu-ws2-history-timeline.png
        prefix = "" if device == "cpu" else device.replace("cuda", "gpu") + "-"
        plot_timeline(records, specs, flips_of[device], results_dir / f"{prefix}history-timeline.png", device)
    plot_s5_history(dated.get("cpu", []), results_dir / "history-s5-ratio.png")
    from harness.publishing.findings import findings_markdown

    (results_dir / "FINDINGS.md").write_text(findings_markdown(atlas))
    write_advisories(atlas)
    from harness.publishing import adapter_grid

    adapter_grid.write(atlas.store)  # ADAPTER-GRID.md, from the newest adapter-grid run


def write_advisories(atlas: Any) -> Path:
    """results/advisories/: every known failure of the atlas as an OSV advisory, and the judge's tables beside them
    (`publishing/advisories.py`); the site's copy of the feed and of the tables its page judges by."""
    from harness.publishing import advisories

    results_dir = atlas.results_dir
    if results_dir.resolve() == RESULTS_DIR.resolve():
        from harness.versions.declared import grow

        # What the measured releases declare they need (read once from their wheels, kept in matrix/declared.json):
        # a way out then names only stacks that install.
        if grow(atlas.tables["releases"], DECLARED_FILE, say=lambda line: print(line, file=sys.stderr)):
            atlas.__dict__.pop("tables", None)
    folder = advisories.write(advisories.build(atlas), atlas.tables, results_dir)
    site = results_dir / "site"
    if site.is_dir():  # the site serves them as a feed beside its page (advisories/index.json)
        import shutil

        shutil.rmtree(site / "advisories", ignore_errors=True)
        shutil.copytree(folder, site / "advisories")
        from harness.publishing.publish import write_site_tables

        write_site_tables(folder, site)  # the page's answer looks versions up in the tables just written
    return folder
