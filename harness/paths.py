"""Where things are in the checkout: one place, so moving a module never moves what it finds."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = REPO_ROOT / "scenarios"
MATRIX_DIR = REPO_ROOT / "matrix"
RESULTS_DIR = REPO_ROOT / "results"
