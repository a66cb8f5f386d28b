"""The two ways docs/advisories-and-audit.md tells users to gate on `compat-matrix audit`, run as written: the
GitHub Actions step's `run:` lines under the shell GitHub gives `shell: bash`, and the pre-commit configuration under
real pre-commit, which installs this repository's hook (.pre-commit-hooks.yaml) from a commit, as a user's would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "advisories-and-audit.md").read_text()
STACK = "torch==2.11.0\ntransformers==5.14.1\npeft==0.20.0\naccelerate==1.14.0\n"
PINS = (("torch", "2.11.0"), ("transformers", "5.14.1"), ("peft", "0.20.0"), ("accelerate", "1.14.0"))
LOCK = "".join(f'[[package]]\nname = "{n}"\nversion = "{v}"\n\n' for n, v in PINS)
FSDP2 = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
RESUME_FSDP2 = "x_COMPAT-MATRIX-S9-cuda-3a1bd84d0d"


def _yaml_blocks() -> list[object]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S)]


def _environ() -> dict[str, str]:
    """This interpreter's scripts first (compat-matrix), and no local wheel folder a shell of ours may export."""
    env = {k: v for k, v in os.environ.items() if k not in ("UV_FIND_LINKS", "PIP_FIND_LINKS")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_documented_actions_step_fails_the_job_and_writes_the_summary(tmp_path: Path) -> None:
    step = next(b[0] for b in _yaml_blocks() if isinstance(b, list) and "run" in b[0])
    assert step["shell"] == "bash"
    (tmp_path / "uv.lock").write_text(LOCK)
    (tmp_path / "accelerate_config.yaml").write_text(FSDP2)
    summary = tmp_path / "summary.md"
    env = _environ() | {"GITHUB_STEP_SUMMARY": str(summary)}
    # what GitHub runs for `shell: bash`: bash --noprofile --norc -eo pipefail {0}
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # an advisory applies: the step, and the job, fail
    table = summary.read_text()
    said, _, table = table.partition("\n\n")  # what was read, one line a file and a config, then the table
    assert said.startswith("- read uv.lock as a uv.lock") and "- read accelerate_config.yaml as an accelerate" in said
    assert table.startswith("| advisory | state |") and RESUME_FSDP2 in table
    assert "upgrade accelerate to 1.15.0" in table and "FSDP1 · LoRA" not in table
    (tmp_path / "uv.lock").write_text(LOCK.replace('"1.14.0"', '"1.15.0"').replace('"5.14.1"', '"5.15.0"'))
    summary.unlink()
    again = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=tmp_path, env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert RESUME_FSDP2 not in summary.read_text()
    assert again.returncode in (0, 1), again.stderr  # other setups' advisories may apply; the resume one is gone


def test_the_documented_pre_commit_hook_blocks_a_commit_of_an_affected_requirements_file(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("pre-commit installs the hook from a git commit: this checkout is not a git repository")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    tracked = subprocess.run(["git", "cat-file", "-e", f"{head.stdout.strip()}:.pre-commit-hooks.yaml"], cwd=REPO)
    if tracked.returncode != 0:
        pytest.skip("HEAD has no .pre-commit-hooks.yaml yet (the hook is installed from a commit)")
    config = next(b for b in _yaml_blocks() if isinstance(b, dict) and "repos" in b)
    hook_repo = config["repos"][0]
    assert hook_repo["hooks"][0]["id"] == "compat-matrix-audit"
    hook_repo["repo"], hook_repo["rev"] = str(REPO), head.stdout.strip()
    user = tmp_path / "project"
    user.mkdir()
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    (user / "requirements.txt").write_text(STACK)
    (user / "README.md").write_text("a project that fine-tunes with LoRA\n")
    env = _environ() | {"PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["git", "init", "-q"], cwd=user, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=user, check=True, env=env)
    hook = [sys.executable, "-m", "pre_commit", "run", "--files"]
    blocked = subprocess.run([*hook, "requirements.txt"], cwd=user, env=env, capture_output=True, text=True)
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert RESUME_FSDP2 in blocked.stdout and "upgrade accelerate to 1.15.0" in blocked.stdout, blocked.stdout
    assert "FSDP1 · LoRA" not in blocked.stdout  # the hook's args (--setup fsdp2,lora) reached audit
    untouched = subprocess.run([*hook, "README.md"], cwd=user, env=env, capture_output=True, text=True)
    assert untouched.returncode == 0 and "no files to check" in untouched.stdout, untouched.stdout
