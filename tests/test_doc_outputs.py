"""The example outputs in README.md and docs/ are what their commands print now: each `<!-- output: ... -->` block is
run and compared (`python3 -m harness doc-outputs --write` rewrites them). The README's `lookup` once showed one
scenario where the command printed two; this test makes such drift fail here, not for a reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.tools.upkeep.doc_outputs import _BLOCK, Example, examples, run

EXAMPLES = examples()


def test_the_readme_and_the_docs_show_generated_outputs() -> None:
    where = {e.path.name for e in EXAMPLES}
    assert {"README.md", "lookup-and-check.md", "advisories-and-audit.md"} <= where, where
    assert any("audit" in e.command and "uv.lock" in e.command and "--accelerate-config" in e.command
               for e in EXAMPLES if e.path.name == "README.md")  # fmt: skip
    assert all(e.shown.strip() for e in EXAMPLES), [e.command for e in EXAMPLES if not e.shown.strip()]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.path.name}:{e.command[:60]}")
def test_each_example_output_is_what_its_command_prints(example: Example) -> None:
    assert run(example.command) == (example.code, example.shown), (
        f"{example.path.name}: `{example.command}` prints something else: python3 -m harness doc-outputs --write"
    )


def test_a_drifted_example_is_caught(tmp_path: Path) -> None:
    """The comparison can fail: a block whose text differs by one line is found stale."""
    example = EXAMPLES[0]
    text = f"<!-- output: {example.command} -->\n```text\n{example.shown}extra line\n```\n"
    (tmp_path / "doc.md").write_text(text)
    [found] = examples([tmp_path / "doc.md"])
    assert _BLOCK.search(text) and run(found.command) != (found.code, found.shown)
