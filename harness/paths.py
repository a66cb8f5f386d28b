"""Where things are in the checkout: one place, so moving a module never moves what it finds."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = REPO_ROOT / "scenarios"
MATRIX_DIR = REPO_ROOT / "matrix"
RESULTS_DIR = REPO_ROOT / "results"
#: What each measured release declares it needs of the other axis packages (`versions/declared.py` grows it).
DECLARED_FILE = MATRIX_DIR / "declared.json"

# --- the results folder's layout: each folder and file name spelled here once ------------------------------------
#: One matrix run each: `runs/<run id>/` with its meta.json and records.jsonl (or records.jsonl.xz,
#: `recording/packing.py`).
RUNS_FOLDER = "runs"
META_FILE = "meta.json"
RECORDS_FILE = "records.jsonl"
#: A dated run's flips, named: `flips/<run id>/flips.json`, with the probes they ran under `probes/`.
FLIPS_FOLDER = "flips"
FLIPS_FILE = "flips.json"
PROBES_FOLDER = "probes"
#: `bisect/<id>/`: a packaging bisect's probes and its verdict.json.
BISECT_FOLDER = "bisect"
#: `findings/<id>/`: a finding for maintainers, its reproducer and what verifying it ran.
FINDINGS_FOLDER = "findings"
#: `watch/<day>/<profile>/watch.json`: the release watch's probes of each day.
WATCH_FOLDER = "watch"
WATCH_FILE = "watch.json"
#: `script-bisect/<name>/`: a user's script's verdict, its runs.jsonl and issue body.
SCRIPT_BISECT_FOLDER = "script-bisect"
#: `adapter-grid/<run id>/`: the adapters grid's run and its sweep.json.
ADAPTER_GRID_FOLDER = "adapter-grid"
#: The OSV advisories and the judge's tables beside them.
ADVISORIES_FOLDER = "advisories"
#: The folder under a results directory where releases asked about are measured (`lookup --measure`, `audit --fix
#: --measure`): one run per stack, read with the probes.
MEASURED_FOLDER = "measured"


def runs_folder(results_dir: Path) -> Path:
    """Where the matrix runs lie."""
    return results_dir / RUNS_FOLDER


def run_path(results_dir: Path, run_id: str) -> Path:
    """One matrix run's folder."""
    return results_dir / RUNS_FOLDER / run_id


def profile_runs(results_dir: Path, profile_name: str) -> list[Path]:
    """Every run folder whose id starts with the profile's name, oldest first (a run id begins with its start)."""
    return sorted(runs_folder(results_dir).glob(f"{profile_name}-*"))


def records_file(run: Path) -> Path:
    """A run's records (read through `recording/records.py`, which takes the packed form too)."""
    return run / RECORDS_FILE


def meta_file(run: Path) -> Path:
    """A run's meta.json."""
    return run / META_FILE


def flips_folder(results_dir: Path, run_id: str) -> Path:
    """The folder of one dated run's named flips and their probes."""
    return results_dir / FLIPS_FOLDER / run_id


def flips_file(results_dir: Path, run_id: str) -> Path:
    """One dated run's named flips."""
    return flips_folder(results_dir, run_id) / FLIPS_FILE
