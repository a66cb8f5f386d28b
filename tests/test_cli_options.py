"""Options as data: the matrix command's options object is built from the option table, every one of its fields
filled by exactly one declared option, and the option checks run in the table's order before the command."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from harness.cli import build_parser
from harness.cli_options import BY_NAME, built_from, first_problem
from harness.environments.envs import InstallOptions
from harness.execution.options import MatrixOptions


def test_every_matrix_field_is_filled_by_one_declared_option() -> None:
    filled = [o.fills for o in BY_NAME["matrix"].options if o.fills]
    assert len(filled) == len(set(filled))
    assert set(filled) == {f.name for f in fields(MatrixOptions)} - {"install"}


def test_a_command_line_becomes_the_options_it_says() -> None:
    argv = ["matrix", "--profile", "ci", "--scenario", "S7", "--cell", "old_*", "--shard", "2/3", "--world-size", "2",
            "--results-dir", "/tmp/r", "--no-shrink", "--date", "2024-07-25", "--fresh"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert first_problem(BY_NAME["matrix"], args) is None
    install = InstallOptions(envs_dir=Path("/tmp/envs"))
    options = MatrixOptions(**built_from(BY_NAME["matrix"], args, install=install))
    assert options == MatrixOptions(
        results_dir=Path("/tmp/r"), install=install, fresh=True, scenario_patterns=("S7",), cell_patterns=("old_*",),
        example_db=Path("/tmp/r/hypothesis-db"), shard=(2, 3), world_sizes=(2,), dates=("2024-07-25",),
        no_shrink=True,
    )  # fmt: skip


def test_the_first_failing_check_in_the_table_is_the_error() -> None:
    args = build_parser().parse_args(["matrix", "--examples", "-1", "--slots", "0", "--fresh", "--resume", "x"])
    assert first_problem(BY_NAME["matrix"], args) == "--examples must be 0 or more"
    args = build_parser().parse_args(["matrix", "--slots", "0", "--fresh", "--resume", "x"])
    assert first_problem(BY_NAME["matrix"], args) == "--slots must be 1 or more"
