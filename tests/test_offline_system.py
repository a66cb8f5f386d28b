"""Air-gapped mode on CPU: a preinstalled "system" python with torch, plus a local wheelhouse in a temp dir.

This is the GPU node's situation (no network, no uv, torch preinstalled), rehearsed here: the old stack is
layered over the system stack with `pip --target`, from the wheelhouse only, with every network route
blocked for the run itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.define.cells import expand
from harness.define.profile import load_profile
from harness.environments import envs
from harness.recording.records import read_records
from tests.conftest import REPO_ROOT, matrix_command

pytestmark = pytest.mark.matrix

OLD_STACK = [
    "transformers==4.41.2",
    "peft==0.12.0",
    "accelerate==0.31.0",
    "tokenizers==0.19.1",
    "huggingface-hub==0.23.4",
]
#: What huggingface-hub 0.23 needs that a hub-1.x system lacks.
SUPPORT = ["requests", "charset-normalizer", "idna", "urllib3", "certifi"]
PROFILE = """
[profile]
device = "cpu"
scenarios = ["S3-*"]
examples_per_scenario = 0
[axes]
torch = ["system"]
[stacks.system]
transformers = "system"
peft = "system"
accelerate = "system"
[stacks.old]
transformers = "4.41.2"
peft = "0.12.0"
accelerate = "0.31.0"
[[implied]]
when = { transformers = "<4.45" }
pins = { tokenizers = "==0.19.1", huggingface-hub = "==0.23.4" }
[install]
mode = "system"
overlay_support = ["requests", "charset-normalizer", "idna", "urllib3", "certifi"]
"""


@pytest.fixture(scope="module")
def system_python() -> Path:
    """A ready python with torch and the current stack: the CI profile's current cell stands in for the node."""
    profile = load_profile("ci", REPO_ROOT / "matrix")
    cell = next(c for c in expand(profile) if c.stack == "current")
    env = envs.ensure_env(cell, profile, envs.InstallOptions(envs_dir=envs.default_envs_dir()))
    assert env.failure is None, env.failure
    return env.python


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """Built while the network is allowed; the matrix run below gets none."""
    dest = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(dest),
            *OLD_STACK,
            *SUPPORT,
        ],
        check=True,
    )
    return dest


def test_system_torch_overlay_from_wheelhouse_without_network(tmp_path: Path, system_python: Path, wheelhouse: Path):
    profile = tmp_path / "airgap.toml"
    profile.write_text(PROFILE)
    results = tmp_path / "results"
    no_network = {
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "",
        "UV_OFFLINE": "1",
    }
    proc = subprocess.run(
        [
            *matrix_command(str(profile), str(results)),
            "--envs-dir",
            str(tmp_path / "envs"),
            "--offline",
            "--wheelhouse",
            str(wheelhouse),
            "--system-torch",
            str(system_python),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ) | no_network,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = read_records(next(results.glob("runs/*/records.jsonl")))
    assert records and all(r["outcome"] == "pass" for r in records), [r["message"] for r in records]
    by_stack = {r["cell"].split("_")[0]: r for r in records}
    system_versions = json.loads(
        subprocess.run([str(system_python), "-c", envs.LIST_VERSIONS], capture_output=True, text=True).stdout
    )
    old, system = by_stack["old"], by_stack["system"]
    assert old["versions"]["transformers"] == "4.41.2" and old["versions"]["peft"] == "0.12.0"
    assert old["install"]["mode"] == "system-overlay"
    assert {"transformers", "peft", "accelerate", "tokenizers", "huggingface-hub"} <= set(old["install"]["overlaid"])
    assert old["versions"]["torch"] == system_versions["torch"]
    assert system["install"]["mode"] == "system"
    assert system["versions"]["transformers"] == system_versions["transformers"]
