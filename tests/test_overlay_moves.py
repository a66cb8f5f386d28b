"""What a bisect-script move installs, resolved by the real uv against the real index (metadata only, nothing
installed): a move never breaks a held package's requirements, and a moved torch carries its CUDA libraries.

The stacks are the atlas's 2024-09-26 and 2024-12-07 days, written out (the versions their environments hold), so
the test needs no 5 GB environment; the committed verdict `results/script-bisect/zero3-lora-checkpoint-torch/`
is the same torch move built and run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.environments.envs import InstallOptions
from harness.tools.script_verdicts import script_bisect
from harness.tools.script_verdicts.script_stacks import Stack, is_torch_runtime, plan_overlay

pytestmark = pytest.mark.matrix  # it asks the package index

#: The CUDA libraries torch 2.4.1 and 2.5.1 both pin to the same versions (so no version of theirs changes).
DAY_2024_09_26 = {
    "torch": "2.4.1",
    "transformers": "4.45.0",
    "tokenizers": "0.20.0",
    "huggingface-hub": "0.25.1",
    "nvidia-cudnn-cu12": "9.1.0.70",
    "nvidia-nccl-cu12": "2.20.5",
    "triton": "3.0.0",
    "sympy": "1.13.3",
}


def base(versions: dict[str, str]) -> Stack:
    return Stack("2024-09-26", Path(sys.executable), dict(versions), "dated")


def test_a_move_a_held_package_excludes_is_refused_with_the_reason(tmp_path: Path) -> None:
    """tokenizers 0.21.0 alone over transformers 4.45.0 (which requires tokenizers<0.21): no stack is built, and
    uv's reason names both. A resolution of the moved package alone never saw transformers' requirement."""
    held = {k: v for k, v in DAY_2024_09_26.items() if k in ("transformers", "tokenizers", "huggingface-hub")}
    mode, wanted, reason = plan_overlay(
        base(held),
        ["tokenizers==0.21.0"],
        older_day="2024-09-26",
        newer_day="2024-12-07",
        moving=("tokenizers",),
        options=InstallOptions(envs_dir=tmp_path),
    )
    assert wanted is None and mode == "unresolved", wanted
    assert "transformers" in reason and "tokenizers" in reason, reason


def test_a_moved_torch_carries_its_cuda_libraries_and_only_what_must_move(tmp_path: Path) -> None:
    """torch 2.5.1 over the 2024-09-26 stack: the overlay holds torch and every CUDA library and triton it
    resolves to, changed or not (its libraries look for them next to it), and of the other packages only those
    torch's requirements exclude (sympy: 2.5.1 pins 1.13.1); transformers stays."""
    mode, wanted, reason = plan_overlay(
        base(DAY_2024_09_26),
        ["torch==2.5.1"],
        older_day="2024-09-26",
        newer_day="2024-12-07",
        moving=("torch",),
        options=InstallOptions(envs_dir=tmp_path),
    )
    assert wanted is not None, reason
    assert mode == "newer-dependencies", "sympy 1.13.3 held with torch 2.5.1 cannot resolve"
    assert wanted["torch"] == "2.5.1"
    assert wanted["nvidia-cudnn-cu12"] == "9.1.0.70", "an unchanged CUDA library moves with torch"
    assert "triton" in wanted and any(is_torch_runtime(n) and n.startswith("nvidia-cublas") for n in wanted)
    assert "transformers" not in wanted and "tokenizers" not in wanted and "huggingface-hub" not in wanted
    # Of the packages the stack holds, only the one torch's requirements exclude moves (packages this short
    # stack lacks are resolved, as its environment would have them).
    moved = {n: v for n, v in wanted.items() if n in DAY_2024_09_26 and n != "torch" and not is_torch_runtime(n)}
    assert moved == {"sympy": "1.13.1"}, moved


def test_torch_s_cuda_libraries_are_never_a_move_of_their_own() -> None:
    changed = {
        "torch": ["2.4.1", "2.5.1"],
        "nvidia-nccl-cu12": ["2.20.5", "2.21.5"],
        "triton": ["3.0.0", "3.1.0"],
        "transformers": ["4.45.0", "4.47.0"],
        "tqdm": ["4.66.5", "4.67.1"],
    }
    assert script_bisect.move_order(changed, None) == ["torch", "transformers", "tqdm"]


def test_a_torch_move_is_an_environment_of_its_own_never_an_overlay(tmp_path: Path, monkeypatch) -> None:
    """torch's native libraries and its triton must be the build of the torch that loads them: a CPU bisect's torch
    move gets a whole environment resolved like an atlas day (every other axis package held at the older stack's
    release), as of the older day, else as of the newer day; a resolver that kept another torch is no run."""
    from types import SimpleNamespace

    from harness.define.profile import load_profile
    from harness.environments import envs
    from harness.tools.script_verdicts import script_stacks

    built: list[tuple[dict[str, str], object, object]] = []
    installs = iter(
        [
            envs.EnvResult(None, {}, False, 1.0, failure="torch 2.6.0 needs newer CUDA libraries"),
            envs.EnvResult(Path(sys.executable), {"torch": "2.6.0+cu124", "transformers": "4.45.0"}, False, 90.0),
        ]
    )

    def ensure_env(cell, profile, options):
        built.append((dict(cell.pins), profile.outside_era, profile.outside_era_day))
        return next(installs)

    monkeypatch.setattr(envs, "ensure_env", ensure_env)
    history = load_profile("history", Path(__file__).resolve().parents[1] / "matrix")
    stacks = script_stacks.LocalStacks(history, [], InstallOptions(envs_dir=tmp_path))
    older, newer = SimpleNamespace(day="2024-09-26"), SimpleNamespace(day="2025-03-20")
    moved = stacks.move(base(DAY_2024_09_26 | {"peft": "0.13.0"}), "torch", "2.6.0", older, newer)
    assert [pins["date"] for pins, _, _ in built] == ["2024-09-26", "2025-03-20"]
    pins, freed, until = built[-1]
    assert (pins["torch"], pins["transformers"], pins["peft"]) == ("2.6.0", "4.45.0", "0.13.0")
    assert (freed, until) == (("torch",), "2025-03-20") and "triton" not in pins and "nvidia-nccl-cu12" not in pins
    assert (moved.kind, moved.mode, moved.python) == ("moved", "newer-dependencies", Path(sys.executable))
    # The resolver kept another torch: the move is a failure, never a run of the wrong release.
    installs = iter([envs.EnvResult(Path(sys.executable), {"torch": "2.4.1+cu121"}, True, 0.0)])
    kept = stacks.move(base(DAY_2024_09_26), "torch", "2.6.0", older, newer)
    assert kept.python is None and kept.failure == "torch 2.6.0 asked, 2.4.1 installed"
    # Every other package still moves as an overlay over the older stack's environment.
    assert "torch" in script_stacks.NATIVE_MOVES and "transformers" not in script_stacks.NATIVE_MOVES
