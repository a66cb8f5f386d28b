"""The cost of environments (issue 77): what an environment holds of its own beside uv's cache, what a command will
add, the cap kept by removing the least recently used environment that no process uses, and torch from a CPU-only
index with the build each record names. These tests exist because a cold `bisect-script` over the CPU atlas once
filled about 29 GB of a 2-core machine's disk, and flip probes left 40 environments (11 GB) behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments import disk, envs
from tests.conftest import REPO_ROOT, write_profile

MB = 10**6


def fake_env(root: Path, name: str, own_mb: int = 0, linked_from: Path | None = None, torch: str | None = None,
             used: float | None = None, label: str = "cu132") -> Path:  # fmt: skip
    """An environment as the folder sees one: its marker, `own_mb` of files of its own, and (like uv's installs)
    a hardlink to a file of `linked_from` (uv's cache); a torch/version.py where it holds torch."""
    env = root / name
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    versions = {"torch": torch} if torch else {}
    (env / disk.MARKERS[0]).write_text(f'{{"versions": {__import__("json").dumps(versions)}}}')
    if own_mb:
        (site / "own.bin").write_bytes(os.urandom(own_mb * MB))
    if linked_from is not None:
        os.link(linked_from, site / "linked.bin")
    if torch:
        (site / "torch").mkdir()
        (site / "torch" / "version.py").write_text(f"__version__ = '{torch}+{label}'\ncuda = '13.2'\n")
    if used is not None:
        (env / disk.USED_STAMP).touch()
        os.utime(env / disk.USED_STAMP, (used, used))
    return env


def test_an_environment_counts_as_its_own_only_what_no_link_outside_holds(tmp_path: Path) -> None:
    cache = tmp_path / "uv-cache"
    cache.mkdir()
    big = cache / "torch.so"
    big.write_bytes(os.urandom(8 * MB))
    folder = tmp_path / "envs"
    a = fake_env(folder, "a", own_mb=2, linked_from=big)
    fake_env(folder, "b", own_mb=3, linked_from=big)
    own, linked = disk.measure(a)
    assert 2 * MB <= own < 2.2 * MB and 8 * MB <= linked < 8.2 * MB
    # The folder holds the two environments' own files; the linked file stays in uv's cache whatever goes.
    assert 5 * MB <= disk.folder_bytes(folder) < 5.3 * MB
    big.unlink()  # uv's cache dropped it: the two environments now hold it between them, inside the folder
    assert 13 * MB <= disk.folder_bytes(folder) < 13.5 * MB


HOLDER = """
import sys, time
from pathlib import Path
from harness.environments import disk
disk.mark_used(Path(sys.argv[1]))
print("holding", flush=True)
time.sleep(120)
"""


def test_the_cap_removes_the_least_recently_used_environment_no_process_uses(tmp_path: Path) -> None:
    folder = tmp_path / "envs"
    now = time.time()
    oldest = fake_env(folder, "oldest", own_mb=4, used=now - 400)
    held_elsewhere = fake_env(folder, "held-elsewhere", own_mb=4, used=now - 300)
    older = fake_env(folder, "older", own_mb=4, used=now - 200)
    held_here = fake_env(folder, "held-here", own_mb=4, used=now - 100)
    newest = fake_env(folder, "newest", own_mb=4, used=now)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held_elsewhere)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        disk.mark_used(held_here)
        # 20 MB held, a cap of 15.5 MB and 3 MB about to be built: two must go; the two in use are passed over.
        gone = disk.prune(folder, int(15.5 * MB), room=3 * MB)
        assert [p.path.name for p in gone] == ["oldest", "older"]
        assert not oldest.exists() and not older.exists()
        assert held_elsewhere.exists() and held_here.exists() and newest.exists()
        assert all(4 * MB <= p.freed < 4.3 * MB for p in gone)
        assert disk.pruned_line(gone).startswith("disk: removed 2 least recently used environment(s) (0.0 GB)")
        # Using an environment makes it the most recently used; released, it may go, after those used before it.
        disk.release(held_here)
        assert [p.path.name for p in disk.prune(folder, 5 * MB)] == ["newest", "held-here"]
        assert disk.prune(folder, None) == [] and held_elsewhere.exists()  # no cap: nothing goes
    finally:
        holder.kill()
        holder.wait()


def test_a_build_makes_room_under_the_cap_the_options_give(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "envs"
    fake_env(folder, "old", own_mb=6, used=time.time() - 100, torch="2.15.0")
    fake_env(folder, "recent", own_mb=6, used=time.time(), torch="2.15.0")
    # The cap from the variable, in GB; the new environment's room from the ones built (their median own files).
    monkeypatch.setenv(disk.CAP_VAR, str(14 * MB / disk.GB))
    options = envs.InstallOptions(envs_dir=folder)
    assert options.cap() == 14 * MB
    gone = envs.make_room(options, [disk.Planned(folder / "new", "2.15.0")], folder / "new")
    assert [p.path.name for p in gone] == ["old"]
    assert envs.make_room(envs.InstallOptions(envs_dir=folder, max_env_gb=0), [disk.Planned(folder / "n2")]) == []
    monkeypatch.setenv(disk.CAP_VAR, "lots")
    with pytest.raises(Exception, match="COMPAT_MATRIX_MAX_ENV_GB='lots'"):
        envs.InstallOptions(envs_dir=folder).cap()


def test_the_estimate_counts_a_new_torch_whole_and_a_held_one_by_its_own_files(tmp_path: Path) -> None:
    cache = tmp_path / "uv-cache"
    cache.mkdir()
    stack = cache / "torch.so"
    stack.write_bytes(os.urandom(10 * MB))
    folder = tmp_path / "envs"
    fake_env(folder, "era_date-2026-11-24-aaaa", own_mb=1, linked_from=stack, torch="2.15.0")
    fake_env(folder, "era_date-2026-11-27-aaaa", own_mb=1, linked_from=stack, torch="2.15.0")
    need = disk.estimate(
        [
            disk.Planned(folder / "era_date-2026-11-24-aaaa", "2.15.0"),  # built: reused
            disk.Planned(folder / "current-cccc", "2.15.0"),  # a new environment of a torch held: its own files
            disk.Planned(folder / "old-dddd", "2.14.0"),  # a torch no environment holds: its whole stack
            disk.Planned(folder / "old-eeee", "2.14.0"),  # ... once
            disk.Planned(folder / "era_date-2026-11-24-bbbb"),  # a day built under other settings: its torch
            disk.Planned(folder / "era_date-2026-12-05-ffff"),  # resolved as of its day: counted as new
        ],
        folder,
        cap=20 * disk.GB,
    )
    assert (need.reused, need.built, need.unknown_torch) == (1, 5, 1)
    assert need.new_torches == ["2.14.0 (cuda)"]
    whole, own = 11 * MB, 1 * MB
    assert abs(need.new_bytes - (own + whole + own + own + whole)) < 0.5 * MB
    line = need.line()
    assert line.startswith("disk: 5 environment(s) to build (up to 0.0 GB; new torch: 2.14.0 (cuda); 1 whose torch")
    assert "1 reused" in line and "cap 20 GB" in line and "GB free" in line
    # Nothing built yet: the measured fallbacks (a CUDA stack 5.7 GB, a CPU one 1.3 GB).
    empty = disk.estimate([disk.Planned(tmp_path / "x" / "a", "2.15.0", "cpu")], tmp_path / "x", None)
    assert empty.new_bytes == disk.FALLBACK_STACK["cpu"] and "no cap" in empty.line()


def test_the_torch_build_is_read_from_its_files_without_importing_it(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "e", torch="2.15.0")
    assert disk.torch_build(env) == "cu132"
    assert disk.torch_of(env) == ("2.15.0+cu132", "cu132")
    assert disk.torch_build(fake_env(tmp_path, "c", torch="2.13.0", label="cpu")) == "cpu"
    assert disk.torch_build(fake_env(tmp_path, "none")) is None


def test_uv_links_an_environment_to_its_cache_and_copies_on_request(tmp_path: Path) -> None:
    """What uv does here (measured, not assumed): two environments of the same package hold its files as links to
    uv's cache, so each holds little of its own; `--link-mode copy` makes each hold the whole."""
    uv = envs.uv_binary()
    sizes = {}
    for mode in ("hardlink", "copy"):
        for name in ("one", "two"):
            env = tmp_path / mode / name
            subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(env)], check=True)
            subprocess.run(
                [uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"), "--link-mode", mode,
                 "packaging==24.2"],
                check=True, env=dict(os.environ, UV_FIND_LINKS=""),
            )  # fmt: skip
        sizes[mode] = disk.folder_bytes(tmp_path / mode)
    wheel_files = list((tmp_path / "hardlink" / "one").glob("lib/python*/site-packages/packaging/*.py"))
    assert wheel_files and all(f.stat().st_nlink >= 2 for f in wheel_files)
    assert sizes["copy"] > sizes["hardlink"] + 100_000  # packaging's files, twice


DATED_TORCH = """
[profile]
python = "3.11"
device = "cpu"
[axes]
date = ["2026-07-29"]
[stacks.day]
torch = "latest"
"""


@pytest.mark.matrix
def test_torch_from_a_cpu_index_is_the_days_release_and_says_its_build(tmp_path: Path) -> None:
    """The plumbing of `--torch-index`, offline from a CPU-only index: the machine's folder of CPU wheels stands for
    https://download.pytorch.org/whl/cpu (not reachable here). A dated cell takes the torch release its day resolves
    to on PyPI (2.13.0 on 2026-07-29, as the atlas recorded) from that index, the rest from PyPI, and its
    environment says which build it holds; without the index the same cell is another environment."""
    wheels = Path(os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()[0].removeprefix("file://"))
    if not list(wheels.glob("torch-2.13.0+cpu-*.whl")):
        pytest.skip(f"no torch 2.13.0+cpu wheel in {wheels}")
    profile = load_profile(str(write_profile(tmp_path, DATED_TORCH)), tmp_path)
    (cell,) = expand(profile)
    options = envs.InstallOptions(envs_dir=tmp_path / "envs", torch_index=str(wheels), max_env_gb=0)
    built = envs.ensure_env(cell, profile, options)
    assert built.failure is None, built.failure
    assert built.versions["torch"] == "2.13.0+cpu" and built.torch_build == "cpu"
    assert built.torch_index == str(wheels) and "sympy" in built.versions  # its dependencies, from PyPI
    again = envs.ensure_env(cell, profile, options)
    assert again.reused and again.torch_build == "cpu"
    pypi = envs.env_dir_for(cell, profile, envs.InstallOptions(envs_dir=tmp_path / "envs"))
    assert pypi != envs.env_dir_for(cell, profile, options)


@pytest.mark.parametrize(
    ("argv", "environ", "said"),
    [
        (["matrix", "--max-env-gb", "-1"], {}, "--max-env-gb -1.0: expected a number of GB, 0 or more (0: no cap)"),
        (["flips", "--run", "x", "--max-env-gb", "nan"], {}, "--max-env-gb nan: expected a number of GB"),
        (["matrix", "--profile", "ci"], {disk.CAP_VAR: "zz"}, "COMPAT_MATRIX_MAX_ENV_GB='zz': expected a number of GB"),
    ],
)
def test_a_cap_that_is_no_size_is_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], environ: dict[str, str], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", *argv, "--results-dir", str(tmp_path / "r")],
        capture_output=True, text=True, cwd=REPO_ROOT, env=os.environ | environ | {"COMPAT_MATRIX_ENVS": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "r").exists()


def test_the_bench_table_shows_each_cold_scan_and_the_disk_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.tools.upkeep import bench

    side = {"source": "pypi", "wall_s": 60.0, "uv_cache_bytes": 5.1e9, "envs_own_bytes": 0.26e9,
            "envs_apparent_bytes": 5.3e9, "torches": ["2.13.0+cu130"], "atlas_estimate_bytes": 66e9,
            "atlas_estimate_s": 1014}  # fmt: skip
    cpu = side | {
        "source": "/opt/wheels",
        "uv_cache_bytes": 1.1e9,
        "envs_own_bytes": 0.25e9,
        "torches": ["2.13.0+cpu"],
        "atlas_estimate_bytes": 18e9,
    }
    report = {
        "cold_bisect_script 2026-07-29": {"days": ["2026-07-29"], "pypi": side, "index": cpu},
        "cold_bisect_script 2026-07-29 2026-09-16": {"days": ["2026-07-29", "2026-09-16"], "pypi": side},
    }
    bench.print_table(report)
    shown = capsys.readouterr().out
    assert shown.count("cold bisect-script, PyPI torch: wall") == 2
    assert "torch from /opt/wheels" in shown and "disk, PyPI torch / CPU torch" in shown and "3.7x" in shown
