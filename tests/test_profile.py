"""Profiles: the shipped ones load; every kind of bad input names the file and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.errors import ProfileError
from tests.conftest import REPO_ROOT, matrix_command, write_profile
from tests.fault_ledger import record_fault

GOOD = """
[profile]
device = "cpu"
[axes]
torch = ["2.13.0"]
[stacks.old]
transformers = "4.41.2"
peft = "0.12.0"
[stacks.new]
transformers = "latest"
peft = "latest"
[[implied]]
when = { transformers = "<4.45" }
pins = { tokenizers = "==0.19.*" }
[[exclude]]
when = { stack = "new" }
reason = "just because"
"""


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO_ROOT / "matrix").glob("*.toml")))
def test_shipped_profiles_load(name: str) -> None:
    profile = load_profile(name, REPO_ROOT / "matrix")
    assert expand(profile), "a shipped profile must expand to at least one cell"


def test_default_cpu_profile_covers_what_issue_2_asks() -> None:
    profile = load_profile("cpu", REPO_ROOT / "matrix")
    assert profile.device == "cpu"
    assert "2.13.0" in profile.axes["torch"]
    assert {"0.19.2", "latest"} <= set(profile.axes["deepspeed"])
    assert profile.axes["bitsandbytes"] == ("latest",)
    assert {"transformers": "4.41.2", "peft": "0.12.0", "accelerate": "0.31.0"} in profile.stacks.values()
    assert {"transformers": "latest", "peft": "latest", "accelerate": "latest"} in profile.stacks.values()


def test_implied_pins_and_exclusions(tmp_path: Path) -> None:
    cells = expand(load_profile(str(write_profile(tmp_path, GOOD)), tmp_path))
    by_stack = {c.stack: c for c in cells}
    assert "tokenizers==0.19.*" in by_stack["old"].requirements()
    assert not any(r.startswith("tokenizers") for r in by_stack["new"].requirements())
    assert by_stack["new"].excluded_reason == "just because"
    assert by_stack["old"].excluded_reason is None


def test_world_size_axis_expands_every_cell(tmp_path: Path) -> None:
    """`world_size = [1, 2, 4]`: one cell per world size and stack, named by it, sharing the stack's environment;
    `--world-size 4` keeps the cells a 4-GPU runner takes."""
    from harness.environments.envs import InstallOptions, env_dir_for
    from harness.planning.plan import build_plan

    path = write_profile(tmp_path, GOOD.replace('device = "cpu"', 'device = "cpu"\nworld_size = [1, 2, 4]'))
    profile = load_profile(str(path), tmp_path)
    cells = expand(profile)
    assert [c.cell_id for c in cells] == [f"{stack}_torch-2.13.0_ws-{n}" for stack in ("old", "new") for n in (1, 2, 4)]
    options = InstallOptions(envs_dir=tmp_path / "envs")
    assert len({env_dir_for(c, profile, options) for c in cells}) == 2, "one environment per stack"
    four = build_plan(profile, world_sizes=(4,), prune=False).cells
    assert [c.cell_id for c in four] == ["old_torch-2.13.0_ws-4", "new_torch-2.13.0_ws-4"]
    single = load_profile(str(write_profile(tmp_path, GOOD, "single")), tmp_path)
    assert [c.cell_id for c in expand(single)] == ["old_torch-2.13.0", "new_torch-2.13.0"], "one size: ids unchanged"


@pytest.mark.parametrize(
    ("mutation", "key"),
    [
        (lambda t: t.replace('device = "cpu"', 'device = "cpu"\ncolour = "red"'), "profile.colour"),
        (lambda t: t.replace('torch = ["2.13.0"]', 'torch = ["2.13.zero"]'), "axes.torch"),
        (lambda t: t.replace('torch = ["2.13.0"]', 'torch = ["2.13.0"]\ntensorflow = ["2.0"]'), "axes.tensorflow"),
        (lambda t: t.replace('torch = ["2.13.0"]', "torch = []"), "axes.torch"),
        (lambda t: t.replace('peft = "0.12.0"', 'peft = "zero"'), "stacks.old.peft"),
        (lambda t: t.replace('reason = "just because"', 'reason = ""'), "exclude[0].reason"),
        (lambda t: t.replace('"<4.45"', '"<<4.45"'), "implied[0].when.transformers"),
        (lambda t: t.replace('device = "cpu"', 'device = "tpu"'), "profile.device"),
        (lambda t: t + "\n[timeouts]\njob_s = -1\n", "timeouts.job_s"),
        (lambda t: t.replace("[axes]", "[axes"), "toml"),
        (lambda t: t.replace('device = "cpu"', 'device = "cpu"\nworld_size = []'), "profile.world_size"),
        (lambda t: t.replace('device = "cpu"', 'device = "cpu"\nworld_size = [2, 0]'), "profile.world_size"),
        (lambda t: t.replace('device = "cpu"', 'device = "cpu"\nworld_size = [2, 2]'), "profile.world_size"),
        (lambda t: t.replace('device = "cpu"', 'device = "cpu"\nworld_size = "many"'), "profile.world_size"),
    ],
)
def test_bad_profile_names_file_and_key(tmp_path: Path, mutation, key: str) -> None:
    path = write_profile(tmp_path, mutation(GOOD))
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path), tmp_path)
    assert caught.value.key == key
    assert str(path) in str(caught.value)


def run_matrix(profile: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run(matrix_command(profile, results), capture_output=True, text=True, cwd=REPO_ROOT)


def test_bad_profile_cli_one_line_exit_2_nothing_written(tmp_path: Path) -> None:
    path = write_profile(tmp_path, GOOD.replace('torch = ["2.13.0"]', 'torch = ["2.13.0"]\nfoo = ["1"]'))
    results = tmp_path / "results"
    proc = run_matrix(path, results)
    record_fault("bad input: malformed profile key", "exit 2", f"exit {proc.returncode}")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "axes.foo" in proc.stderr and str(path) in proc.stderr
    assert not results.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["matrix", "--examples", "-3"],
        ["matrix", "--scenario", "S99-nope"],
        ["matrix", "--profile", "no-such-profile"],
        ["matrix", "--bogus-flag"],
        ["report", "--run", "no-such-run"],
        ["matrix", "--profile", "ci", "--hypothesis-profile", "sometimes"],
    ],
)
def test_bad_cli_input_exit_2(tmp_path: Path, argv: list[str]) -> None:
    extra = (
        ["--results-dir", str(tmp_path / "r")] if argv[0] in ("matrix", "report") and "--bogus-flag" not in argv else []
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness", *argv, *extra], capture_output=True, text=True, cwd=REPO_ROOT
    )
    record_fault(f"bad input: {' '.join(argv)}", "exit 2", f"exit {proc.returncode}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not (tmp_path / "r" / "runs").exists() or not any((tmp_path / "r" / "runs").iterdir())


def test_unknown_variant_in_a_profile_exit_2(tmp_path: Path) -> None:
    typo = '\n[scenario."S3-lora-sgd-scaling"]\nvariants = ["no_such_fix"]\n'
    text = (REPO_ROOT / "matrix" / "ci.toml").read_text() + typo
    path = write_profile(tmp_path, text, "ci-typo")
    results = tmp_path / "results"
    proc = run_matrix(path, results)
    record_fault("bad input: unknown variant in a profile", "exit 2", f"exit {proc.returncode}")
    assert proc.returncode == 2 and "no_such_fix" in proc.stderr and proc.stderr.count("\n") == 1
    assert not results.exists()


def test_unwritable_results_dir_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")  # root ignores permission bits: a path under a regular file cannot be created at all
    proc = subprocess.run(
        matrix_command("ci", str(not_a_dir / "results")),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    record_fault("bad input: unwritable results directory", "exit 2", f"exit {proc.returncode}")
    assert proc.returncode == 2 and "not writable" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_cell_needing_more_gpus_than_the_node_has_is_skipped_with_the_reason() -> None:
    from harness.define.registry import discover
    from harness.execution.executor import _gpu_shortfall

    s1 = next(s for s in discover() if s.id.startswith("S1-"))
    s3 = next(s for s in discover() if s.id.startswith("S3-"))
    assert _gpu_shortfall(s1, "cuda", 4, {"gpu_count": 2}) == "needs 4 GPUs (world size 4), this node has 2"
    assert _gpu_shortfall(s1, "cuda", 2, {"gpu_count": 2}) is None
    assert _gpu_shortfall(s1, "cpu", 4, {"gpu_count": 0}) is None, "gloo ranks are processes"
    assert _gpu_shortfall(s3, "cuda", 1, {"gpu_count": 1}) is None
