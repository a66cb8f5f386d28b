"""Slurm, the scale-out engine: a profile as a job array (one shard per array task) plus a merge-and-report job
that depends on the array, and multi-node launches as `srun` + torchrun's c10d rendezvous.

Everything the array's tasks share (the checkout, the results directory, the environments directory) must sit
on a filesystem every node sees, as it does on the clusters this is for.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import OptionError, UsageError
from harness.paths import REPO_ROOT


def srun_prefix(nnodes: int) -> list[str]:
    """One task per node of the allocation, each a torchrun agent; a failed agent ends the whole step."""
    return [
        "srun",
        f"--nodes={nnodes}",
        f"--ntasks={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]


def default_rdzv_endpoint() -> str:
    """Where the c10d store listens when the user names none: this host (the allocation's first node, where a
    batch script runs) on a port free now."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"{socket.gethostname()}:{port}"


def require(*commands: str) -> None:
    """Bad input, not a crash, when Slurm's commands are not on PATH."""
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        raise UsageError(f"Slurm's {', '.join(missing)} not found on PATH: run this on a Slurm login node")


@dataclass(frozen=True)
class Submission:
    array_job: str
    report_job: str
    folder: Path
    #: With --wait: the report job's exit status (None when not waited for).
    report_status: int | None = None


def submit_profile(
    profile: str,
    tasks: int,
    results_dir: Path,
    matrix_args: list[str],
    sbatch_args: list[str],
    wait: bool,
) -> Submission:
    """`sbatch --array=1-N` running `matrix --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`, then a report
    job with `--dependency=afterany` on the array (a failed shard still gets its records into the table)."""
    if tasks < 1:
        raise OptionError("{tasks} must be 1 or more")
    require("sbatch")
    results_dir = results_dir.resolve()
    folder = results_dir / "slurm" / time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    folder.mkdir(parents=True, exist_ok=True)
    harness = f"cd {shlex.quote(str(REPO_ROOT))} && exec {shlex.quote(sys.executable)} -m harness"
    shared = f"--results-dir {shlex.quote(str(results_dir))}"
    extra = " ".join(shlex.quote(a) for a in matrix_args)
    array = folder / "array.sbatch"
    array.write_text(
        _script(
            f"compat-{profile}",
            folder / "shard-%a.out",
            f"{harness} matrix --profile {shlex.quote(profile)} {shared} --no-report "
            f'--shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT" {extra}',
        )
    )
    report = folder / "report.sbatch"
    report.write_text(_script(f"compat-{profile}-report", folder / "report.out", f"{harness} report {shared}"))
    array_job, _ = _sbatch([f"--array=1-{tasks}", *sbatch_args, str(array)])
    waiting = ["--wait"] if wait else []
    report_job, status = _sbatch([f"--dependency=afterany:{array_job}", *waiting, *sbatch_args, str(report)])
    return Submission(array_job, report_job, folder, status if wait else None)


def _script(name: str, output: Path, command: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --output={output}",
            "set -euo pipefail",
            # Slurm exports the submitter's environment (PATH with uv, the caches) by default.
            command,
            "",
        ]
    )


def _sbatch(arguments: list[str]) -> tuple[str, int]:
    """The job id (and, with --wait, the job's exit status: sbatch --wait returns it)."""
    proc = subprocess.run(["sbatch", "--parsable", *arguments], capture_output=True, text=True, env=os.environ)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise UsageError(f"sbatch {' '.join(arguments)} failed: {proc.stderr.strip() or 'no job id printed'}")
    return lines[0].split(";")[0], proc.returncode
