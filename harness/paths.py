"""Where things are in the checkout: one place, so moving a module never moves what it finds."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = REPO_ROOT / "scenarios"
MATRIX_DIR = REPO_ROOT / "matrix"
RESULTS_DIR = REPO_ROOT / "results"
#: The folder under a results directory where releases asked about are measured (`lookup --measure`, `audit --fix
#: --measure`): one run per stack, read with the probes.
MEASURED_FOLDER = "measured"
#: What each measured release declares it needs of the other axis packages (`versions/declared.py` grows it).
DECLARED_FILE = MATRIX_DIR / "declared.json"
