"""Reduce a wide matrix: pairwise (all-pairs) selection of cells, with the coverage it reaches.

The dimensions are the stack (when the profile has stacks) and every axis with more than one value.
allpairspy picks the combinations; each maps back to the cell of the full product with those values, so
pins, implied pins and exclusions stay exactly as in the full matrix.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from harness.define.cells import Cell

METHODS = ("none", "pairwise")


@dataclass(frozen=True)
class Reduction:
    method: str
    cells_full: int
    cells: int
    pairs_total: int
    pairs_covered: int

    @property
    def pair_coverage(self) -> float:
        return self.pairs_covered / self.pairs_total if self.pairs_total else 1.0

    def as_json(self) -> dict[str, object]:
        return self.__dict__ | {"pair_coverage": round(self.pair_coverage, 4)}


def _dimensions(cell: Cell) -> dict[str, str]:
    dims = {"stack": cell.stack or ""}
    dims |= {p: v for p, v in cell.choices if p not in cell.stack_packages}
    return dims


def reduce_cells(cells: list[Cell], method: str) -> tuple[list[Cell], Reduction]:
    """The cells to run under `method`, and what that covers."""
    if method not in METHODS:
        raise ValueError(f"unknown reduction {method!r} (known: {', '.join(METHODS)})")
    by_values = {tuple(_dimensions(c).items()): c for c in cells}
    names = list(_dimensions(cells[0])) if cells else []
    values = {n: sorted({_dimensions(c)[n] for c in cells}) for n in names}
    varying = [n for n in names if len(values[n]) > 1]
    if method == "none" or len(varying) < 2:
        chosen = list(cells)
    else:
        # Imported here: a GPU node running the plain CLI (no network, no extra packages) never needs it.
        from allpairspy import AllPairs

        chosen = []
        for combo in AllPairs([values[n] for n in varying]):
            picked = dict(zip(varying, combo, strict=True))
            key = tuple((n, picked.get(n, values[n][0])) for n in names)
            cell = by_values[key]
            if cell not in chosen:
                chosen.append(cell)
    return chosen, Reduction(method, len(cells), len(chosen), *_pair_coverage(chosen, varying, values))


def _pair_coverage(chosen: list[Cell], varying: list[str], values: dict[str, list[str]]) -> tuple[int, int]:
    wanted = {(a, va, b, vb) for a, b in itertools.combinations(varying, 2) for va in values[a] for vb in values[b]}
    seen = set()
    for cell in chosen:
        dims = _dimensions(cell)
        seen |= {(a, dims[a], b, dims[b]) for a, b in itertools.combinations(varying, 2)}
    return len(wanted), len(wanted & seen)
