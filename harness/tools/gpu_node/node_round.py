"""`bisect-script-node`: one round of `bisect-script --device cuda` on the GPU node (node_script.py plans it).

The node runs the same search as the planner over the same plan: each planned stack's wheels installed from the
round's pack (no index) as a `pip --target` overlay over the node's own python and torch, the script run there. It
stops at the first run the plan lacks, or when the call's time is nearly spent, and leaves `OUT/<name>/`
(runs.jsonl, call.json) to be brought back.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.environments import envs
from harness.environments import overlay as target_overlay
from harness.errors import UsageError
from harness.tools.gpu_node.node_script import PLAN, PlannedStacks, stack_label
from harness.tools.script_verdicts.script_bisect import End, ScriptBisect, Unplanned, run
from harness.tools.script_verdicts.script_stacks import Stack
from harness.tools.script_verdicts.stack_run import read_json_lines

#: Seconds a node keeps in hand at the end of its call to copy its runs back, and an overlay's install.
RESERVE_S = 60.0
INSTALL_S = 30.0
#: What a first run is taken to need before any run has been timed (then 1.5 x the longest so far).
FIRST_RUN_S = 120.0


class NodeOverlays:
    """On the node: each planned stack's wheels installed (no dependencies, nothing from an index) into a
    `--target` overlay over the node's python, optional packages that cannot import there left out."""

    def __init__(
        self, python: Path, wheelhouse: Path, work: Path, optional: tuple[str, ...], deadline: float, timeout_s: float
    ) -> None:
        self.python, self.wheelhouse, self.work, self.optional = python, wheelhouse, work, optional
        self.deadline, self.timeout_s = deadline, timeout_s

    def install(self, planned: Stack, entry: dict[str, Any], longest_run: float = 0.0) -> Stack:
        """The overlay of `planned`, unless its install and run (1.5 x the longest run so far; before any, up to
        FIRST_RUN_S) and the copy back would not fit the call's time: then the round stops there."""
        run_s = min(self.timeout_s, 1.5 * longest_run if longest_run else FIRST_RUN_S)
        if time.monotonic() + INSTALL_S + run_s + RESERVE_S > self.deadline:
            raise Unplanned({**(planned.request or {}), "stopped": "the call's time is spent"})
        target = self.work / hashlib.sha256((planned.identity or "").encode()).hexdigest()[:16]
        started = time.monotonic()
        target_overlay.discard(target)
        site = target / "site"
        site.mkdir(parents=True)
        pins = [f"{n}=={v}" for n, v in sorted(entry.get("overlay", {}).items())]
        if pins:
            flags = ["--no-index", "--find-links", str(self.wheelhouse)]
            argv = target_overlay.install_argv(target_overlay.installer(self.python), site, pins, flags)
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                return replace(planned, failure=envs.summarise_install_error(proc.stderr or proc.stdout))
        left_out = envs.leave_out_unimportable(self.python, site, self.optional)
        versions = envs.installed_versions(self.python, pythonpath=str(site))
        return replace(
            planned, python=self.python, pythonpath=str(site), versions=versions, left_out=left_out,
            seconds=time.monotonic() - started,
        )  # fmt: skip


def node_device(python: Path) -> dict[str, Any]:
    """What the node's python sees: CUDA and its GPUs (the run's facts say where it ran)."""
    probe = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps({'kind': 'cuda' if n else 'cpu', 'gpus': n, 'torch': torch.__version__,"
        " 'name': torch.cuda.get_device_name(0) if n else None, 'cuda': torch.version.cuda}))"
    )
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"kind": "unknown", "error": (proc.stderr or "").strip().splitlines()[-1:]}
    return json.loads(proc.stdout)


def unpack_wheels(pack_or_dir: Path) -> Path:
    """A pack unpacked into a temporary folder (a folder of wheels is used as it is)."""
    if pack_or_dir.is_dir():
        return pack_or_dir
    from harness.environments.wheel_pack import unpack

    dest = Path(tempfile.mkdtemp(prefix="script-wheels-"))
    unpack(pack_or_dir, dest)
    return dest


def python_of(text: str | None) -> Path:
    return Path(shutil.which(text) or text) if text else Path(sys.executable)


def node_command(args: Any) -> int:
    """`bisect-script-node`: one round on the node, as far as its plan and its time go."""
    import uuid

    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions
    from harness.paths import MATRIX_DIR
    from harness.recording.runs import now_iso

    started = time.monotonic()
    plan_path = args.folder / PLAN
    if not plan_path.is_file():
        raise UsageError(f"{args.folder}: no {PLAN} (plan a round with bisect-script --device cuda first)")
    plan = json.loads(plan_path.read_text())
    script = Path(plan["script"])
    if not script.is_file() or hashlib.sha256(script.read_bytes()).hexdigest() != plan["script_sha256"]:
        raise UsageError(f"{script}: missing or not the script the plan was made for")
    out_dir = args.out / args.folder.name
    out_dir.mkdir(parents=True, exist_ok=True)
    _merge_runs(args.folder / "runs.jsonl", out_dir / "runs.jsonl")
    python = python_of(args.python or "python3")
    device = node_device(python)
    wanted = (plan.get("launch") or {}).get("node_torch")
    if wanted and device.get("torch") and device["torch"] != wanted:
        raise UsageError(f"this node's torch is {device['torch']}, the plan's stacks were resolved over {wanted}")
    wheels = unpack_wheels(args.wheels)
    profile = load_profile(plan["profile_path"], MATRIX_DIR)
    work = Path(tempfile.mkdtemp(prefix="script-overlays-"))
    bisect = ScriptBisect(
        script, out_dir, profile, InstallOptions(envs_dir=work), nproc=plan["nproc"], torchrun=plan["torchrun"],
        timeout_s=plan["timeout_s"], match=plan["match"], device=device,
        search=(plan.get("launch") or {}).get("search", "bisect"),  # the planner's (a plan before the sweep bisected)
    )  # fmt: skip
    node = NodeOverlays(python, wheels, work, profile.optional, started + args.time_limit, plan["timeout_s"])
    bisect.source = PlannedStacks(plan, bisect, node)
    call = {
        "call_id": uuid.uuid4().hex[:12],
        "plan_id": plan.get("plan_id"),
        "round": plan["round"],
        "finished": None,
        "wall_s": 0.0,
        "runs": 0,
        "runs_reused": 0,
        "pack_bytes": args.wheels.stat().st_size if args.wheels.is_file() else None,
        "device": device,
        "stopped_before": None,
    }

    def account(_: Any = None) -> None:
        """The call as it stands, after every run: a call killed from outside still says what it did."""
        call.update(wall_s=round(time.monotonic() - started, 1), runs=bisect.cost.runs)
        call.update(runs_reused=bisect.cost.runs_reused)
        (out_dir / "call.json").write_text(json.dumps(call, indent=1) + "\n")

    account()
    bisect.after_run = account
    print(f"bisect-script-node: round {plan['round']} of {args.folder.name} on {device.get('name') or device['kind']}"
          f" x {device.get('gpus', 0)}, {len(plan['stacks'])} planned stack(s)")  # fmt: skip
    all_moves = bool((plan.get("launch") or {}).get("all_moves"))
    try:
        ends = [End(day=d) for d in plan["ends"]]
        run(bisect, ends, End(day=plan["bad"]) if plan["bad"] else None, all_moves=all_moves)
    except Unplanned as stop:
        call["stopped_before"] = stop.request
        print(f"stopped before {stack_label(stop.request) if 'day' in stop.request else stop.request}: "
              f"{stop.request.get('stopped', 'not in this round: plan the next one')}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if wheels != args.wheels:
            shutil.rmtree(wheels, ignore_errors=True)
    call["finished"] = now_iso()
    account()
    print(f"{call['runs']} run(s) in {call['wall_s']:.0f} s; bring back {out_dir}")
    return 0


def _merge_runs(planned: Path, here: Path) -> None:
    """The runs the plan's folder holds, and any this OUT holds already (a call before in the same OUT), in one
    file without duplicates or a torn line, so that no run is made again."""
    runs = {r["key"]: r for r in [*read_json_lines(planned), *read_json_lines(here)]}
    here.write_text("".join(json.dumps(r) + "\n" for r in runs.values()))
