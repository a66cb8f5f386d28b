"""A real single-host Slurm for the tests: Debian's munge, one slurmctld and two slurmd daemons on this host
(nodes n1 and n2, each on its own port), so a job array and a two-node `srun` run as they would on a cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
NODES = ("n1", "n2")


def why_not() -> str | None:
    """Why a Slurm cannot be started here (None when it can)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to launch jobs, and the tests do not run as root"
    if not Path("/etc/munge/munge.key").is_file():
        return "no munge key at /etc/munge/munge.key"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    folder: Path
    conf: Path
    started_munge: bool

    def env(self) -> dict[str, str]:
        return os.environ | {"SLURM_CONF": str(self.conf)}

    def stop(self) -> None:
        """Shut the daemons down and wait for them: the next test session starts its own on new ports."""
        subprocess.run(["scontrol", "shutdown"], env=self.env(), capture_output=True, timeout=30)
        pids = []
        for pid_file in self.folder.glob("*.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.5)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        if self.started_munge:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)


def start(folder: Path) -> SlurmCluster:
    """munged (unless running), slurmctld and slurmd n1 + n2, on free ports; waits until both nodes are idle."""
    started_munge = False
    # Whether munged runs, not whether its socket exists: a munged that was killed leaves the socket behind, and
    # every Slurm command then hangs. --force starts over such a leftover socket.
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", _sbin("munged"), "--force"], check=True, timeout=30)
        started_munge = True
    host = socket.gethostname()
    cpus = os.cpu_count() or 1
    conf = folder / "slurm.conf"
    lines = [
        "ClusterName=compat",
        f"SlurmctldHost={host}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}/%n",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
        f"SlurmctldPort={free_port()}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        # Two nodes on one host, each claiming every core: the array's two tasks run side by side, and a
        # two-node srun puts one task on each, as on two machines.
        *(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} "
            "RealMemory=1000 State=UNKNOWN"
            for node in NODES
        ),
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
    ]
    (folder / "state").mkdir(parents=True, exist_ok=True)
    for node in NODES:
        (folder / "spool" / node).mkdir(parents=True, exist_ok=True)
    conf.write_text("\n".join(lines) + "\n")
    cluster = SlurmCluster(folder, conf, started_munge)
    env = cluster.env()
    subprocess.run([_sbin("slurmctld"), "-f", str(conf)], env=env, check=True, timeout=60)
    for node in NODES:
        subprocess.run([_sbin("slurmd"), "-f", str(conf), "-N", node], env=env, check=True, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.split()
        if states and all(s == "idle" for s in states):
            return cluster
        time.sleep(1)
    cluster.stop()
    raise RuntimeError(f"Slurm nodes not idle after 60 s: {(folder / 'slurmctld.log').read_text()[-2000:]}")
