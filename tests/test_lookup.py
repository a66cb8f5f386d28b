"""`lookup`: a user's versions find the exact rows, else the two atlas dates that bracket them, else the nearest
rows with a plain warning that the answer is an extrapolation; the line per scenario gives the first fix."""

from __future__ import annotations

import subprocess
import sys

from harness.tools.lookup import answer, matches, parse_query, render, rows_of

S1 = "S1-dora-fsdp-checkpoint"
SPEC = {
    "target": ["checkpoint-recompute-dtype*"],
    "variants": {"use_reentrant": ["workaround"], "cast_forward_inputs": ["fix"]},
}


def record(cell: str, versions: dict[str, str], date: str | None, outcome: str, variant: str = "baseline") -> dict:
    return {
        "cell": cell,
        "scenario": S1,
        "variant": variant,
        "config_id": "c1",
        "config": {},
        "outcome": outcome,
        "signature": "checkpoint-recompute-dtype[float32->bfloat16]" if outcome == "fail" else None,
        "versions": versions,
        "pins": {"date": date} if date else {},
        "hardware": {"device": "cpu", "world_size": 2},
    }


def atlas() -> list[dict]:
    early = {"torch": "2.4.0", "transformers": "4.43.2", "peft": "0.12.0"}
    late = {"torch": "2.4.1", "transformers": "4.45.0", "peft": "0.13.0"}
    pinned = {"torch": "2.13.0+cpu", "transformers": "4.41.2", "peft": "0.12.0"}
    return [
        record("era_date-2024-07-25", early, "2024-07-25", "fail"),
        record("era_date-2024-07-25", early, "2024-07-25", "pass", "use_reentrant"),
        record("era_date-2024-07-25", early, "2024-07-25", "pass", "cast_forward_inputs"),
        record("era_date-2024-09-26", late, "2024-09-26", "pass"),
        record("old_torch-2.13.0", pinned, None, "fail"),
    ]


def test_version_prefixes_match_releases_and_nothing_else() -> None:
    assert matches("2.4.1", "2.4") and matches("2.13.0+cpu", "2.13.0")
    assert not matches("2.40.0", "2.4") and not matches("2.4.1", "2.4.0") and not matches(None, "2.4")
    assert parse_query(["torch==2.4", "PEFT==0.12"]) == {"torch": "2.4", "peft": "0.12"}


def test_an_exact_row_is_shown_as_exact() -> None:
    result = answer(rows_of(atlas()), {"torch": "2.13", "peft": "0.12"})
    assert result.case == "exact"
    assert [r.cell for r in result.rows] == ["old_torch-2.13.0"]


def test_versions_between_two_atlas_dates_show_both_and_what_differs() -> None:
    result = answer(rows_of(atlas()), {"torch": "2.4", "transformers": "4.44", "peft": "0.12"})
    assert result.case == "between atlas dates"
    assert [r.date for r in result.rows] == ["2024-07-25", "2024-09-26"]
    assert result.differs["transformers"] == ["4.44", "4.43.2, 4.45.0"]
    text = render(result, {S1: SPEC})
    # A real fix is offered before a workaround.
    assert (
        "FAILS (checkpoint-recompute-dtype[float32->bfloat16]) on 1/1 configs; "
        "try: FSDP: MixedPrecision(cast_forward_inputs=True) (fix)" in text
    )
    assert "target not reproduced (0/1)" in text


def test_versions_outside_the_atlas_say_they_extrapolate() -> None:
    result = answer(rows_of(atlas()), {"peft": "0.3"})
    assert result.case == "outside the atlas"
    assert render(result, {S1: SPEC}).startswith("outside the atlas: EXTRAPOLATING")
    assert {r.versions["peft"] for r in result.rows} == {"0.12.0"}


def test_bad_input_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "harness", "lookup", "torch=2.4"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "expected PACKAGE==VERSION" in done.stderr
