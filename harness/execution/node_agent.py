"""The other nodes of a multi-node run: start this node's torchrun agent for every launch node 0 makes.

Node 0 runs `python -m harness matrix --nnodes N --rdzv-endpoint HOST:PORT` with its results (and cell
environments) on a filesystem every node shares. Each launch directory it creates holds `launch.json`
(the torchrun command with a c10d rendezvous, and the cell's environment). Every other node runs
`python -m harness node-agent --watch <results-dir>`: it starts the same command for each new launch,
so its ranks join the rendezvous, tail the same job feed, and write their events next to node 0's. When
node 0 is done with a launch it writes `stop`, and the agent kills its part of the tree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from harness.execution.proctree import ORCHESTRATOR_VAR, TOKEN_VAR, kill_token

POLL_S = 0.2


class NodeAgent:
    """Watches a shared directory for launches and mirrors them on this node."""

    def __init__(self, watch: Path) -> None:
        self.watch = watch
        self.running: dict[Path, tuple[subprocess.Popen, str]] = {}
        self.seen: set[Path] = set()

    def poll(self) -> None:
        for launch in sorted(self.watch.glob("**/launch-*/launch.json")):
            out_dir = launch.parent
            if out_dir in self.seen or (out_dir / "stop").exists():
                continue
            self.seen.add(out_dir)
            self.running[out_dir] = self._start(out_dir, json.loads(launch.read_text()))
        for out_dir, (proc, token) in list(self.running.items()):
            if (out_dir / "stop").exists() or proc.poll() is not None:
                kill_token(token)
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                del self.running[out_dir]

    def _start(self, out_dir: Path, info: dict) -> tuple[subprocess.Popen, str]:
        token = uuid.uuid4().hex
        # Our own pid as "orchestrator": the workers' watchdog then stops them if this agent dies.
        env = os.environ | info["env"] | {TOKEN_VAR: token, ORCHESTRATOR_VAR: str(os.getpid())}
        log = open(out_dir / f"agent-{os.uname().nodename}-{os.getpid()}.log", "wb")
        proc = subprocess.Popen(
            info["command"],
            env=env,
            cwd=info.get("cwd"),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        return proc, token

    def stop_all(self) -> None:
        for _, (proc, token) in list(self.running.items()):
            kill_token(token)
            proc.wait()
        self.running.clear()


def serve(watch: Path) -> int:
    """Run until SIGTERM/SIGINT; everything this agent started is stopped on the way out."""
    agent = NodeAgent(watch)
    stop = {"now": False}

    def request_stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print(f"node-agent: watching {watch} for launches (pid {os.getpid()})", file=sys.stderr, flush=True)
    try:
        while not stop["now"]:
            agent.poll()
            time.sleep(POLL_S)
    finally:
        agent.stop_all()
    return 0
