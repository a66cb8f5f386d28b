"""A way out installs: what each release declares it needs (its wheel's Requires-Dist) is read from the index, met by
the stack after the moves, and the page's port reads specifiers as Python does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.knowledge.installable import admits, complete, refusal
from harness.knowledge.judge import Query
from harness.knowledge.ways_out import way_out
from harness.paths import DECLARED_FILE
from harness.publishing.advisories import read_tables
from harness.versions.declared import axis_requirements, read_declared, wheel_metadata
from tests.conftest import REPO_ROOT, run_node

JUDGE_JS = REPO_ROOT / "harness" / "publishing" / "site_judge.js"
OLD_STACK = {"torch": "2.4.1", "transformers": "4.46.3", "peft": "0.13.2", "accelerate": "1.0.1", "deepspeed": "0.15.4"}

releases = st.tuples(st.integers(0, 6), st.integers(0, 12), st.integers(0, 12)).map(lambda t: ".".join(map(str, t)))
clauses = st.one_of(
    st.tuples(st.sampled_from([">=", "<=", ">", "<", "==", "!="]), releases).map("".join),
    st.tuples(st.sampled_from(["==", "!="]), releases).map(lambda t: f"{t[0]}{t[1].rsplit('.', 1)[0]}.*"),
    st.tuples(st.just("~="), releases).map("".join),
)
specifiers = st.lists(clauses, min_size=1, max_size=3).map(",".join)


@settings(max_examples=400, deadline=None)
@given(specifiers, releases)
def test_admits_reads_a_specifier_as_packaging_does(specifier: str, release: str) -> None:
    assert admits(specifier, release) == SpecifierSet(specifier).contains(Version(release)), (specifier, release)


def test_the_page_reads_specifiers_as_python_does(tmp_path: Path) -> None:
    cases = [(s, r) for s in ("<3,>=2.3", "~=1.1", "~=2.4.1", "==2.4.*", "!=2.5.*", ">2.4", "===2.4.1", ">=2.5")
             for r in ("2.3.0", "2.4", "2.4.1", "2.5.0", "1.1.5", "1.2.0", "3.0.0", "2.4.1+cpu")]  # fmt: skip
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    script = (
        "const judge = require(process.argv[1]); const cases = require(process.argv[2]);"
        "process.stdout.write(JSON.stringify(cases.map(([s, r]) => judge.admits(s, r))));"
    )
    assert run_node(script, str(JUDGE_JS), str(tmp_path / "cases.json"), timeout=120) == [
        admits(s, r) for s, r in cases
    ]
    assert [admits(s, r) for s, r in cases if r == "2.4.1+cpu"] == [True, False, True, True, True, True, False, False]


def test_a_moved_release_brings_the_releases_it_declares_it_needs() -> None:
    """transformers 5.15.0 declares torch>=2.5 and accelerate>=1.1.0: moved onto torch 2.4.1 and accelerate 1.0.1 it
    brings the nearest measured torch and accelerate that meet them (upgrades), each declaration then met."""
    tables = read_tables(REPO_ROOT / "results" / "advisories")
    assert tables["declared"]["transformers"]["5.15.0"] == {"accelerate": ">=1.1.0", "torch": ">=2.5"}
    moves = complete(tables, OLD_STACK, {"transformers": "5.15.0"})
    assert moves is not None and moves["transformers"] == "5.15.0"
    assert Version(moves["torch"]) >= Version("2.5") and Version(moves["accelerate"]) >= Version("1.1.0")
    nearer = [v for v in tables["releases"]["torch"] if Version("2.5") <= Version(v) < Version(moves["torch"])]
    assert nearer == [], nearer  # the nearest measured torch that meets it
    assert refusal(tables["declared"], OLD_STACK | moves, moves) is None
    # The user's own stack refusing itself is not the way out's doing; a release no measured one admits is no way out.
    assert complete(tables, OLD_STACK, {}) == {}
    assert complete(tables | {"releases": tables["releases"] | {"torch": ["2.4.1"]}}, OLD_STACK,
                    {"transformers": "5.15.0"}) is None  # fmt: skip


def test_the_way_out_of_an_old_stack_names_only_stacks_that_declare_themselves_installable() -> None:
    tables = read_tables(REPO_ROOT / "results" / "advisories")
    query = Query(OLD_STACK, {"engine": "zero3", "adapter": "lora"})
    found = way_out(tables, query)
    assert found["pins"], found
    stack = OLD_STACK | found["pins"]
    assert refusal(tables["declared"], stack, found["pins"]) is None, stack
    for notes in found["notes"].values():
        for note in notes:
            if note.get("release"):
                moved = {note["package"]: note["release"], **note["along"]}
                assert refusal(tables["declared"], OLD_STACK | moved, moved) is None, note


def test_a_stack_measured_not_to_run_is_never_a_way_out() -> None:
    tables = read_tables(REPO_ROOT / "results" / "advisories")
    query = Query(OLD_STACK, {"engine": "zero3", "adapter": "lora"})
    first = way_out(tables, query)
    broken = {"versions": OLD_STACK | first["pins"], "why": "a record says it did not import"}
    again = way_out(tables | {"broken": [broken]}, query)
    assert again["pins"] != first["pins"], again


def test_the_declarations_are_the_wheels_own() -> None:
    """Read again from the index (a range read of the wheel), a committed declaration is the same."""
    committed = read_declared(DECLARED_FILE)
    metadata = wheel_metadata("transformers", "5.15.0")
    if metadata is None:
        pytest.fail("transformers 5.15.0 has no wheel on the index")
    assert axis_requirements(metadata) == committed["transformers"]["5.15.0"]
    sample = 'Requires-Dist: torch>=2.5; extra == "torch"\nRequires-Dist: accelerate>=1.1.0; extra == "torch"\n'
    sample += 'Requires-Dist: deepspeed>=0.9.3; extra == "deepspeed"\nRequires-Dist: numpy>=1.17\n'
    assert axis_requirements(sample) == {"torch": ">=2.5", "accelerate": ">=1.1.0"}  # no deepspeed extra, no numpy
