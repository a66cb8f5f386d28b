"""Pairwise reduction: every pair of values of any two dimensions in some cell, with far fewer cells."""

from __future__ import annotations

import itertools
from pathlib import Path

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.versions.reduction import reduce_cells
from tests.conftest import write_profile

WIDE = """
[profile]
device = "cpu"
reduce = "pairwise"
[axes]
torch = ["2.10.0", "2.11.0", "2.12.0", "2.13.0"]
deepspeed = ["0.19.2", "0.19.4", "0.19.6", "0.19.8"]
bitsandbytes = ["0.47.0", "0.48.0", "0.49.0", "0.50.2"]
"""


def test_pairwise_reduction_of_a_4x4x4_matrix_covers_every_pair(tmp_path: Path) -> None:
    profile = load_profile(str(write_profile(tmp_path, WIDE)), tmp_path)
    full = expand(profile)
    chosen, reduction = reduce_cells(full, profile.reduce)
    assert reduction.cells_full == len(full) == 64
    assert reduction.cells == len(chosen) <= 20  # an optimal all-pairs design needs 16
    assert reduction.pairs_total == 3 * 16 and reduction.pair_coverage == 1.0
    for a, b in itertools.combinations(["torch", "deepspeed", "bitsandbytes"], 2):
        covered = {(c.pins[a], c.pins[b]) for c in chosen}
        assert covered == {(c.pins[a], c.pins[b]) for c in full}
    assert all(c in full for c in chosen)  # real cells of the product: same pins, implied pins, exclusions
    print(f"pairwise: {reduction.cells} of {reduction.cells_full} cells, pair coverage {reduction.pair_coverage:.0%}")


def test_no_reduction_keeps_the_full_product(tmp_path: Path) -> None:
    profile = load_profile(str(write_profile(tmp_path, WIDE.replace('reduce = "pairwise"', ""))), tmp_path)
    chosen, reduction = reduce_cells(expand(profile), profile.reduce)
    assert len(chosen) == 64 and reduction.pair_coverage == 1.0 and reduction.method == "none"
