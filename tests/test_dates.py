"""The date axis: one era-consistent stack per install date (uv --exclude-newer), with named exceptions."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile, parse_date_rule
from harness.environments.envs import era_flags
from harness.errors import ProfileError, UsageError
from harness.versions import releases
from tests.conftest import write_profile

DATED = """
[profile]
python = "3.11"
device = "cpu"
[axes]
date = ["2024-03-01", "2025-01-10"]
[stacks.era]
torch = "latest"
transformers = "latest"
peft = "latest"
bitsandbytes = "latest"
[install]
outside_era = ["bitsandbytes>=0.48"]
"""


def test_dated_cells_carry_their_day_and_no_pin_for_it(tmp_path: Path) -> None:
    profile = load_profile(str(write_profile(tmp_path, DATED)), tmp_path)
    cells = expand(profile)
    assert [c.cell_id for c in cells] == ["era_date-2024-03-01", "era_date-2025-01-10"]
    assert [c.date for c in cells] == ["2024-03-01", "2025-01-10"]
    assert cells[0].requirements() == ["torch", "transformers", "peft", "bitsandbytes"]
    assert cells[0].env_key("3.11", ()) != cells[1].env_key("3.11", ())


def test_uv_gets_the_cells_day_and_the_exceptions_the_newest_day(tmp_path: Path) -> None:
    profile = load_profile(str(write_profile(tmp_path, DATED)), tmp_path)
    first = expand(profile)[0]
    assert era_flags(first, profile) == [
        "--exclude-newer",
        "2024-03-01T00:00:00Z",
        "--exclude-newer-package",
        "bitsandbytes=2025-01-10T23:59:59Z",
    ]


def test_cells_without_a_day_keep_their_environment_key(tmp_path: Path) -> None:
    """Adding the date axis must not rebuild every existing environment: the key of an undated cell is the
    hash it always was."""
    profile = load_profile("ci", Path(__file__).resolve().parent.parent / "matrix")
    cell = expand(profile)[0]
    assert cell.date is None and era_flags(cell, profile) == []
    extra = ("hypothesis",)
    blob = json.dumps({"python": "3.11", "req": cell.requirements(), "extra": list(extra)}, sort_keys=True)
    assert cell.env_key("3.11", extra) == hashlib.sha256(blob.encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    ("axes", "install", "key"),
    [
        ('date = ["2024-3-1"]', "", "axes.date"),
        ('date = ["2024-03-01", "2024-03-01"]', "", "axes.date"),
        ('date = "peft majors >=0.9"', "", "axes.date"),
        ('torch = ["2.13.0"]', 'outside_era = ["bitsandbytes"]', "install.outside_era"),
        ('date = ["2024-03-01"]', 'outside_era = ["left-pad"]', "install.outside_era"),
    ],
)
def test_bad_dates_name_the_key(tmp_path: Path, axes: str, install: str, key: str) -> None:
    text = f'[profile]\npython = "3.11"\ndevice = "cpu"\n[axes]\n{axes}\n[install]\n{install}\n'
    with pytest.raises(ProfileError) as caught:
        load_profile(str(write_profile(tmp_path, text)), tmp_path)
    assert caught.value.key == key


def test_one_day_per_minor_release_after_its_first_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [
        {"filename": "peft-0.8.2-py3-none-any.whl", "upload-time": "2024-01-30T10:00:00Z"},
        {"filename": "peft-0.9.0.tar.gz", "upload-time": "2024-02-28T12:00:00Z"},
        {"filename": "peft-0.9.0-py3-none-any.whl", "upload-time": "2024-02-28T11:00:00Z"},
        {"filename": "peft-0.10.0rc1-py3-none-any.whl", "upload-time": "2024-03-10T11:00:00Z"},
        {"filename": "peft-0.10.0-py3-none-any.whl", "upload-time": "2024-03-21T23:30:00Z"},
        {"filename": "peft-0.10.1-py3-none-any.whl", "upload-time": "2024-04-02T08:00:00Z"},
    ]
    monkeypatch.setattr(releases, "index_files", lambda package: files)
    rule = parse_date_rule("p.toml", "axes.date", "peft minors >=0.9")
    days = releases.minor_release_days(rule, today=dt.date(2026, 11, 24))
    assert days == ["2024-02-29", "2024-03-22", "2026-11-24"]


def test_wide_profiles_run_an_examples_fixes_only_where_its_baseline_fails(tmp_path: Path) -> None:
    from harness.define.registry import select
    from harness.execution.scenario_run import baseline_first

    text = DATED.replace("[axes]", 'example_variants = "where-baseline-fails"\n[axes]')
    wide = load_profile(str(write_profile(tmp_path, text)), tmp_path)
    plain = load_profile(str(write_profile(tmp_path, DATED, "plain")), tmp_path)
    s1, s3 = select(["S1"])[0], select(["S3"])[0]
    example = {"config": {}, "config_id": "x", "source": "example"}
    drawn = {"config": {}, "config_id": "y", "source": "hypothesis"}
    assert baseline_first(s1, example, wide) and not baseline_first(s1, example, plain)
    assert baseline_first(s1, drawn, plain)
    assert not baseline_first(s3, example, wide)  # S3 measures every variant


def test_dated_cells_take_no_local_wheels() -> None:
    """A find-links wheel has no upload date, so uv cannot hold it to the cell's day: a local torch 2.13.0 once
    landed in the 2025-07-04 stack. Dated cells resolve from the index alone."""
    from harness.environments.envs import index_flags

    environ = {"PIP_FIND_LINKS": "/opt/wheels"}
    assert index_flags(environ) == ["--find-links", "/opt/wheels"]
    assert index_flags(environ, dated=True) == []


def test_growing_a_dated_run_adds_only_new_days(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--grow: the run's days stay (other resolved axes too), the days the rule gives now and --add-date join
    them, so the plan's new cells are exactly the new days'."""
    from harness.planning.plan import build_plan

    ruled = DATED.replace('date = ["2024-03-01", "2025-01-10"]', 'date = "peft minors >=0.9"')
    profile = load_profile(str(write_profile(tmp_path, ruled)), tmp_path)
    monkeypatch.setattr(releases, "minor_release_days", lambda rule, today=None: ["2024-03-01", "2025-01-10"])
    recorded = {"date": ["2024-03-01"], "deepspeed": ["0.19.2"]}
    grown = releases.grown_dates(profile, recorded, ("2026-12-01",))
    assert grown == {"date": ["2024-03-01", "2025-01-10", "2026-12-01"], "deepspeed": ["0.19.2"]}
    before = {c.cell_id for c in build_plan(profile, resolved=recorded, prune=False).cells}
    after = {c.cell_id for c in build_plan(profile, resolved=grown, prune=False).cells}
    assert before < after and after - before == {"era_date-2025-01-10", "era_date-2026-12-01"}
    with pytest.raises(UsageError):
        releases.grown_dates(profile, recorded, ("Dec 1",))
    listed = load_profile(str(write_profile(tmp_path, DATED, "listed")), tmp_path)
    with pytest.raises(UsageError, match="add the day there"):
        releases.grown_dates(listed, recorded, ())
