"""The report stage: from the selected runs' records to everything published (COMPATIBILITY.md, reproducers,
matrix.json, the site, JUnit, pictures). Run after every matrix and by `compat-matrix report`."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UsageError


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
    from harness.define.registry import discover
    from harness.publishing.report import render_markdown, select_runs

    selection = select_runs(results_dir, run_ids)
    if not selection.run_ids:
        raise NothingToReport(f"no records under {results_dir / 'runs'}; run `nox -s matrix` first")
    known = discover()
    specs = {s.id: s.spec for s in known}
    text = render_markdown(selection, specs)
    from harness.publishing.publish import changes_markdown, changes_since_previous

    text += changes_markdown(changes_since_previous(results_dir, selection))
    from harness.publishing.atlas import flips_markdown, newest_flips, plot_s5_history, plot_timeline

    flips = newest_flips(results_dir, selection.run_ids)
    text += flips_markdown(flips, selection.latest()[0], specs)
    output = output or results_dir / "COMPATIBILITY.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    if output == results_dir / "COMPATIBILITY.md":
        from harness.publishing.publish import publish
        from harness.publishing.repro import sync_repros

        sync_repros(selection.records, {s.id: s for s in known}, results_dir / "repros")
        publish(results_dir, selection, specs)
        from harness.publishing.plots import plot_real_size
        from harness.publishing.report import real_size_rows

        latest = selection.latest()[0]
        plot_real_size(real_size_rows(latest), results_dir / "s5-real-size.png")
        plot_timeline(latest, specs, flips, results_dir / "history-timeline.png")
        plot_s5_history(latest, results_dir / "history-s5-ratio.png")
    return output
