"""`compat-matrix lookup PINS --measure`: the asked releases measured here when no record holds them.

The stack is the nearest older install day's (the history profile's date rule), every asked package moved to its
release (a prefix like `4.46` takes its newest patch), the rest as of that day, or as of the day the newest asked
release came out where that is later (its dependencies need releases of that day); where the asked release cannot
install as of it, the dependencies resolve as of the newer bracketing day, the other axis packages still held. The
scenarios asked about run their seed configs with every fix, as a one-cell matrix run under
`results/measured/<stack>/`; the answer is then read from that row like any other record (`lookup` reads
`results/measured/` with the probes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.define.profile import DATE_AXIS, Profile, load_profile
from harness.errors import UsageError, stopped_by
from harness.execution.matrix import run_matrix
from harness.execution.options import MatrixOptions
from harness.paths import MATRIX_DIR, MEASURED_FOLDER, records_file
from harness.recording.record import Record
from harness.tools.release_search.flip_naming import held_stack
from harness.versions import releases
from harness.versions.matching import at_most, matches


def exact_release(package: str, wanted: str, python: str | None) -> str:
    """The release a user's version names: itself where it is one, else the newest release it is a prefix of."""
    found = [str(v) for v in releases.releases(package, python) if matches(str(v), wanted)]
    if not found:
        raise UsageError(f"{package}=={wanted}: no installable release of {package} matches it on the index")
    return found[-1]


def base_days(rows: list[Any], wanted: dict[str, str]) -> tuple[Any, Any | None]:
    """(the CPU atlas day whose stack is the newest at or below every asked release, else the oldest day; the next day
    after it): the stack the asked releases are moved onto, and the one whose dependencies are tried where they need
    newer ones."""
    dated = sorted((r for r in rows if r.date and r.device == "cpu" and r.source == "table"), key=lambda r: r.date)
    if not dated:
        raise UsageError("no CPU atlas day in the table: no stack to move these releases onto")
    below = [r for r in dated if all(at_most(r.versions.get(p), v) for p, v in wanted.items())]
    base = below[-1] if below else dated[0]  # older than every day: moved back onto the oldest
    after = [r for r in dated if r.date > base.date]
    return base, (after[0] if after else None)


def measure(
    results_dir: Path,
    rows: list[Any],
    wanted: dict[str, str],
    scenarios: list[str],
    say: Any = print,
) -> Path:
    """Build and run the asked stack for `scenarios` here on CPU; returns the run's directory."""
    history = load_profile("history", MATRIX_DIR)
    pins = {p: exact_release(p, v, history.python) for p, v in wanted.items()}
    base, newer = base_days(rows, wanted)
    versions = {p: v for p, v in base.versions.items() if p in AXIS_PACKAGES} | pins
    today = os.environ.get("COMPAT_MATRIX_TODAY") or dt.date.today().isoformat()
    label = "+".join([str(base.date), *(f"{p}-{v}" for p, v in sorted(pins.items()))])
    out_dir = results_dir / MEASURED_FOLDER / label
    say(f"measuring {', '.join(f'{p} {v}' for p, v in pins.items())} on the {base.date} stack "
        f"({', '.join(f'{p} {v}' for p, v in versions.items() if p not in pins)}): {', '.join(scenarios)}")  # fmt: skip
    days = resolution_days(str(base.date), str(newer.date) if newer is not None else None, pins)
    for day in days:
        stack = _stack(history, versions, day, tuple(pins), today, label)
        summary = run_matrix(stack, _options(results_dir, out_dir, scenarios))
        if summary.interrupted:
            raise stopped_by(summary.signal)
        if not could_not_install(summary.run_dir):
            return summary.run_dir
        say(
            f"  the stack does not install with dependencies as of {day}"
            + ("; trying the next day's" if day != days[-1] else "")
        )
    return summary.run_dir


def resolution_days(base: str, newer: str | None, pins: dict[str, str]) -> list[str]:
    """The days whose dependencies are tried, in order: the base day, or the day the newest asked release came out
    where that is later (transformers 5.15.0 needs a huggingface-hub no 2024 day has); then the next atlas day."""
    released = [d for d in (releases.release_day(p, v) for p, v in pins.items()) if d]
    first = max([base, *released])
    return [first] + ([newer] if newer and newer > first else [])


def _stack(history: Profile, versions: dict[str, str], day: str, moved: tuple[str, ...], today: str,
           label: str) -> Profile:  # fmt: skip
    """One cell: the axis packages at `versions`, everything else as of `day`, the moved ones resolved up to today."""
    held = held_stack(history, versions, day, "measured-" + hashlib.sha256(label.encode()).hexdigest()[:8])
    return replace(held, outside_era=moved, outside_era_day=today)


def _options(results_dir: Path, out_dir: Path, scenarios: list[str]) -> MatrixOptions:
    from harness.environments.envs import InstallOptions, default_envs_dir

    return MatrixOptions(
        results_dir=out_dir, install=InstallOptions(envs_dir=default_envs_dir()), fresh=True,
        scenario_patterns=tuple(scenarios), examples=0, example_db=None,
    )  # fmt: skip


def did_not_run(run_dir: Path) -> str | None:
    """Why the run's stack installed and ran nothing (every record env-broken: it does not import), or None."""
    from harness.recording.records import read_records

    records = read_records(records_file(run_dir), warn=False)
    if not records or any(r["outcome"] != "env-broken" for r in records):
        return None
    return str(records[0].get("message") or records[0].get("signature") or "env-broken").splitlines()[0]


def could_not_install(run_dir: Path) -> str | None:
    """Why the run's stack did not install (the resolver's cause), or None where it did."""
    from harness.recording.records import read_records

    records = read_records(records_file(run_dir), warn=False)
    if not records or any(r["outcome"] != "install-failed" for r in records):
        return None
    message = records[0].get("message") or "the install failed"
    cause = [line.strip() for line in message.splitlines() if line.strip().startswith(("cause:", "Because"))]
    return (cause[0].removeprefix("cause:").strip() if cause else message.splitlines()[0]).strip()


def date_of(record: Record) -> str | None:
    return (record.get("pins") or {}).get(DATE_AXIS)
