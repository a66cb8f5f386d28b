"""For the harness's own tests, not a compatibility scenario: a job that imports a package found only on the
user's PYTHONPATH (installed there with `pip --target`), so `check` can show its workers see what the user sees.
Found only when $COMPAT_MATRIX_EXTRA_SCENARIOS names it."""

from __future__ import annotations

SPEC = {
    "id": "F2-pythonpath",
    "title": "A package on the user's PYTHONPATH (harness tests only)",
    "known_issues": [],
    "world_size": 1,
    "device": "cpu",
    "requires": [],
    "target": [],
    "controls": [],
    "variants": {"baseline": ("baseline", "import the package installed with pip --target")},
}

EXAMPLES = [{"n": 1}]


def strategy():
    from hypothesis import strategies as st

    return st.just({"n": 1})


def run(config: dict, variant: str, ctx: dict) -> dict:
    import compat_matrix_target_probe  # only on PYTHONPATH

    return {"metrics": {"probe": compat_matrix_target_probe.VALUE}, "path": "pythonpath"}
