"""Property tests of the harness itself, with Hypothesis: matrix expansion, signature normalisation,
the record round-trip, and that resume (re-appending) and merge are idempotent."""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.recording.records import RecordWriter, merge, read_records, record_key
from harness.recording.signatures import exception_signature, normalise_message

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

versions = st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.integers(0, 9), st.integers(0, 30), st.integers(0, 9))
axis_values = st.lists(st.one_of(versions, st.just("latest")), min_size=1, max_size=3, unique=True)


@SETTINGS
@given(
    axes=st.dictionaries(st.sampled_from(["torch", "deepspeed", "bitsandbytes"]), axis_values, min_size=1),
    stacks=st.dictionaries(
        st.sampled_from(["old", "mid", "new"]),
        st.fixed_dictionaries({"transformers": st.one_of(versions, st.just("latest")), "peft": versions}),
        max_size=3,
    ),
)
def test_expansion_is_the_full_product_with_unique_ids(axes: dict, stacks: dict) -> None:
    lines = ['[profile]\ndevice = "cpu"', "[axes]"] + [f"{k} = {json.dumps(v)}" for k, v in axes.items()]
    for name, pins in stacks.items():
        lines += [f"[stacks.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in pins.items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prop.toml"
        path.write_text("\n".join(lines) + "\n")
        cells = expand(load_profile(str(path), Path(tmp)))
    assert len(cells) == math.prod(len(v) for v in axes.values()) * max(1, len(stacks))
    assert len({c.cell_id for c in cells}) == len(cells)
    expected = {
        (stack, combo)
        for stack in (list(stacks) or [None])
        for combo in itertools.product(*(sorted(axes[a]) for a in sorted(axes)))
    }
    got = {(c.stack, tuple(c.pins[a] for a in sorted(axes))) for c in cells}
    assert got == expected
    for cell in cells:
        for package, value in cell.pins.items():
            line = package if value == "latest" else f"{package}=={value}"
            assert line in cell.requirements()


VOLATILE = {
    "number": st.integers(0, 10**9).map(str),
    "address": st.integers(0, 2**48).map(hex),
    "path": st.lists(st.text("abcxyz_-", min_size=1, max_size=6), min_size=1, max_size=4).map(
        lambda parts: "/" + "/".join(parts)
    ),
}


@SETTINGS
@given(
    kinds=st.tuples(st.sampled_from(sorted(VOLATILE)), st.sampled_from(sorted(VOLATILE))),
    template=st.sampled_from(["tensor at {} has size {}", "cannot open {}: {}", "{} vs {} mismatch"]),
    data=st.data(),
)
def test_signature_ignores_volatile_parts(kinds: tuple[str, str], template: str, data: st.DataObject) -> None:
    """Numbers, addresses and paths differ between runs; the signature of the same failure must not."""
    one = template.format(*(data.draw(VOLATILE[k]) for k in kinds))
    other = template.format(*(data.draw(VOLATILE[k]) for k in kinds))
    assert normalise_message(one) == normalise_message(other)
    assert exception_signature("builtins.RuntimeError", one) == exception_signature("builtins.RuntimeError", other)


@SETTINGS
@given(message=st.text(max_size=200))
def test_signature_is_total_and_stable(message: str) -> None:
    first = exception_signature("builtins.ValueError", message)
    assert first and first == exception_signature("builtins.ValueError", message)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
records = st.lists(
    st.fixed_dictionaries(
        {
            "cell": st.sampled_from(["old_a", "new_a"]),
            "scenario": st.sampled_from(["S1-x", "S4-y"]),
            "variant": st.sampled_from(["baseline", "fix"]),
            "config_id": st.sampled_from(["c1", "c2", "c3"]),
            "outcome": st.sampled_from(["pass", "fail"]),
            "run_id": st.sampled_from(["r1", "r2"]),
            "config": st.dictionaries(st.text(max_size=8), json_values, max_size=4),
        }
    ),
    max_size=12,
)


@SETTINGS
@given(batch=records)
def test_records_round_trip_and_reappending_adds_nothing(batch: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.jsonl"
        with RecordWriter(path) as writer:
            written = [r for r in batch if writer.append(r)]
        assert len(written) == len({record_key(r) for r in batch})
        assert read_records(path) == written
        before = path.read_bytes()
        with RecordWriter(path) as writer:  # a resumed run offers the same records again
            assert not any(writer.append(r) for r in batch)
        assert path.read_bytes() == before


@SETTINGS
@given(first=records, second=records)
def test_merge_is_idempotent(first: list[dict], second: list[dict]) -> None:
    once = merge([first, second])
    assert merge([once]) == once
    assert merge([once, first, second]) == once
    assert merge([first, first]) == merge([first])
