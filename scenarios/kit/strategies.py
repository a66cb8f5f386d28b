"""Hypothesis building blocks shared by scenarios.

Every setting lists the seed's value first, so Hypothesis' simplest config is the seed's, and shrinking a
failure puts back every setting it does not need: a minimal config reads as "the seed config, except ...".
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def axis(defaults: dict[str, Any], name: str, *others: Any) -> st.SearchStrategy[Any]:
    """The seed's value of `name` first, then the others."""
    return st.sampled_from([defaults[name], *others])


def seed_config(defaults: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**defaults, **changes}


def near_seed(
    defaults: dict[str, Any], anywhere: st.SearchStrategy[dict[str, Any]], names: list[str], max_changes: int = 2
) -> st.SearchStrategy[dict[str, Any]]:
    """The seed config with at most `max_changes` settings taken from a draw of `anywhere`: failures that need
    several settings at once are rare in a uniform draw and common near the seed."""
    return st.tuples(anywhere, st.sets(st.sampled_from(sorted(names)), max_size=max_changes)).map(
        lambda t: seed_config(defaults, **{k: t[0][k] for k in t[1]})
    )
