"""`bisect-script --device cuda`: a user's script bisected over the GPU atlas's days on an air-gapped node, in rounds.

A node has its own torch (2.11.0+cu130) and no index. So the connected machine plans and the node runs, and both
run the *same* search (`script_bisect.run`) over the same plan:
- **plan** (connected): every stack is a GPU era-lock entry over the node's torch: a scan day is the lock's own
  day (`matrix/locks/<profile>.json`), a move or a bisect probe is the older day with one package moved, resolved
  here as the atlas's node flips resolve theirs (`versions.lock.resolve_probe`, the node's torch held). The search
  is replayed over the runs imported so far; where it needs a run no round has made, it stops (`Unplanned`), and
  that run goes into the next round, with what the search expects to need after it (the remaining moves in
  order, the bisect's next probes of either outcome) as far as one call's wheels allow (64 MiB, a solid pack).
- **node** (`bisect-script-node`, `scripts/gpu-script-bisect.sh`): the search again, each planned stack a
  `pip --target` overlay of its wheels over the node's python, the script run as it would be here; it stops at
  the first run the plan lacks or when the call's time is nearly spent, and its runs come back to be imported.
The node decides nothing the connected side would decide differently: both read the same plan and the same runs,
so the runs a verdict counts are the runs a sequential search makes (moves, then ceil(log2 n) bisect probes), and a
round only changes how many device calls it takes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.define.profile import Profile
from harness.errors import UsageError
from harness.paths import REPO_ROOT, SCRIPT_BISECT_FOLDER
from harness.recording.runs import now_iso
from harness.tools.script_verdicts.script_bisect import (
    End,
    ScriptBisect,
    Unplanned,
    checked_ends,
    run,
    write_issue,
)
from harness.tools.script_verdicts.script_stacks import Stack, releases_after
from harness.tools.script_verdicts.stack_run import earlier_runs, read_json_lines

PLAN = "node-plan.json"
CALLS = "device-calls.jsonl"
#: Stacks one round resolves beyond the one it must (each a uv resolution here, about 20 s; cached by stack), and how
#: many at once (uv waits on the index more than on this machine's cores).
LOOKAHEAD = 40
RESOLVERS = 8
#: Replays of the search in one invocation: each settles stacks that need no node (they cannot resolve).
MAX_REPLAYS = 20


#: What in a script's source says it needs an era package when it runs: its import name, or what makes another
#: package load it (transformers loads bitsandbytes for a BitsAndBytesConfig and DeepSpeed for `deepspeed=`; the
#: Trainer needs accelerate). A package not named here is always planned.
REACHED_BY: dict[str, tuple[str, ...]] = {
    "transformers": ("transformers",),
    "peft": ("peft",),
    "accelerate": ("accelerate", "Accelerator", "Trainer", "SFTTrainer"),
    "deepspeed": ("deepspeed",),
    "bitsandbytes": ("bitsandbytes", "bnb", "BitsAndBytesConfig", "load_in_4bit", "load_in_8bit"),
}


def script_needs(text: str) -> frozenset[str]:
    """The era packages a script can reach (REACHED_BY): a GPU round resolves and packs only those (and what they
    require), never DeepSpeed's wheels for a script that neither imports nor configures it."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    return frozenset(p for p, names in REACHED_BY.items() if words & set(names))


@dataclass(frozen=True)
class NodeAtlas:
    """The GPU atlas a script is scanned over: the era lock of a profile (its days' stacks over the node's torch)
    and the node image it was made for."""

    profile: Profile
    lock: dict[str, Any]
    image: dict[str, Any]
    #: The era packages the script can reach (`script_needs`); None: every one the lock pins.
    needed: frozenset[str] | None = None

    @property
    def days(self) -> list[str]:
        return sorted(d for d in self.lock["days"])

    @property
    def axis(self) -> list[str]:
        """The packages a day pins (what a probe holds at the older day's release): those of the lock the script can
        reach; what they require resolves with them as of the day."""
        pinned = [p for p in self.profile.era_packages if p in self.lock.get("requirements", [])]
        return pinned if self.needed is None else [p for p in pinned if p in self.needed or p not in REACHED_BY]

    @classmethod
    def of(cls, profile: Profile) -> NodeAtlas:
        from harness.tools.gpu_node.locking import node_image
        from harness.versions import lock_file

        if not profile.era_packages:
            raise UsageError(f"--profile {profile.name}: not an era-locked GPU profile (no [install] era_packages)")
        matrix_dir = profile.path.parent  # the profile's own folder holds its locks/ and nodes/
        path = lock_file.lock_path(matrix_dir, profile.name)
        if not path.is_file():
            raise UsageError(f"--profile {profile.name}: no era lock {path} (python -m harness lock --profile ...)")
        return cls(profile, lock_file.read_lock(path), node_image(matrix_dir, profile))


def stack_label(request: dict[str, str]) -> str:
    """A planned stack's name: the day, or the day with one package moved ('2025-11-14 + peft==0.18.1')."""
    if request.get("package"):
        return f"{request['day']} + {request['package']}=={request['version']}"
    return request["day"]


def identity(label: str, entry: dict[str, Any]) -> str:
    """What a planned stack is, on both sides: its name and the wheels it installs over the node's python."""
    return json.dumps([label, sorted(entry.get("overlay", {}).items()), entry.get("error")])


class PlannedStacks:
    """The stacks of a round's plan. On the connected machine (no `node`) a stack is only its plan entry and the
    runs imported so far; on the node (`node`: node_round.NodeOverlays) a stack not yet run is installed as an
    overlay and run."""

    def __init__(self, plan: dict[str, Any], bisect: ScriptBisect, node: Any = None) -> None:
        self.plan, self.bisect, self.node = plan, bisect, node

    def scan(self, end: Any) -> Stack:
        if not end.day:
            raise UsageError("--device cuda scans the GPU atlas's days: give days, not pins")
        return self._stack({"day": end.day}, None)

    def move(self, base: Stack, package: str, version: str, older: Any, newer: Any) -> Stack:
        request = {"day": older.day, "package": package, "version": version, "newer": newer.day}
        return self._stack(request, package)

    def releases(self, package: str, old: str, new: str) -> list[str]:
        key = f"{package} {old} {new}"
        if key not in self.plan["releases"]:
            if self.node is not None:
                raise Unplanned({"releases": key})
            self.plan["releases"][key] = releases_after(package, self.bisect.history.python, old, new)
        return list(self.plan["releases"][key])

    def yanked(self, package: str) -> list[str]:
        if package not in self.plan["yanked"] and self.node is None:
            from harness.versions import releases

            self.plan["yanked"][package] = [str(v) for v in releases.yanked(package)]
        return list(self.plan["yanked"].get(package, []))

    def _stack(self, request: dict[str, str], package: str | None) -> Stack:
        label = stack_label(request)
        entry = self.plan["stacks"].get(label)
        if entry is None:
            raise Unplanned(request)
        moved: dict[str, str] = {}
        if package:  # what the node installs that the older day's stack did not have at that version
            older = self.plan["stacks"].get(request["day"], {}).get("overlay", {})
            moved = {n: v for n, v in entry.get("overlay", {}).items() if n == package or older.get(n) != v}
        planned = Stack(label, None, {}, "planned", identity=identity(label, entry), request=request, overlaid=moved)
        if entry.get("error"):
            return replace(planned, failure=entry["error"])
        earlier = self.bisect.earlier.get(self.bisect.key_of(planned))
        if earlier is not None:
            return replace(planned, versions=earlier["stack"].get("versions") or {})
        if self.node is None:
            return planned  # observe() stops here: the next round runs it
        if label not in self.plan.get("pack", {}).get("stacks", []):  # its wheels are not in this round's pack
            raise Unplanned({**request, "stopped": "not carried in this round's pack"})
        return self.node.install(planned, entry, max((o.run.seconds for o in self.bisect.observations), default=0.0))


def launch_of(bisect: ScriptBisect, atlas: NodeAtlas, all_moves: bool) -> dict[str, Any]:
    """What a plan's runs depend on besides its days: a change of any of them plans anew (the node judges runs by
    the plan's, so planner and node must agree on every one)."""
    return {
        "script_sha256": bisect.script_sha,
        "nproc": bisect.nproc,
        "torchrun": bisect.torchrun,
        "timeout_s": bisect.timeout_s,
        "match": bisect.match.pattern if bisect.match else None,
        "all_moves": all_moves,
        "profile": atlas.profile.name,
        "node_torch": atlas.lock["node"].get("torch"),
        "pinned": atlas.axis,
        "search": bisect.search,
    }


def launch_planned(plan: dict[str, Any], atlas: NodeAtlas) -> dict[str, Any]:
    """A plan's launch (a plan from before `launch` was recorded: its own fields, moves until one reproduces)."""
    every = [p for p in atlas.profile.era_packages if p in atlas.lock.get("requirements", [])]  # before `pinned`
    if "launch" in plan:
        return {"pinned": every, "search": "bisect"} | plan["launch"]  # a plan from before the sweep bisected
    keys = ("script_sha256", "nproc", "torchrun", "timeout_s", "match", "profile")
    return {k: plan[k] for k in keys} | {
        "all_moves": False,
        "node_torch": atlas.lock["node"].get("torch"),
        "pinned": every,
    }


def new_plan(
    bisect: ScriptBisect, atlas: NodeAtlas, script: Path, ends: list[str], bad: str | None, launch: dict[str, Any]
) -> dict[str, Any]:
    """An empty plan: what the node needs to run the same search (the script's copy, the launch, the days)."""
    import uuid

    return {
        "plan_id": uuid.uuid4().hex[:12],
        "launch": launch,
        "script": str(script),
        "script_sha256": bisect.script_sha,
        "nproc": bisect.nproc,
        "torchrun": bisect.torchrun,
        "timeout_s": bisect.timeout_s,
        "match": bisect.match.pattern if bisect.match else None,
        "profile": atlas.profile.name,
        "profile_path": _relative(atlas.profile.path, REPO_ROOT),
        "ends": ends,
        "bad": bad,
        # The script's own dependencies no day meets: every stack of this plan is resolved with them.
        "extra": own_dependencies(bisect.extras, atlas, ends),
        "round": 0,
        "stacks": {},
        "releases": {},
        "yanked": {},
    }


def plan_round(bisect: ScriptBisect, atlas: NodeAtlas, plan: dict[str, Any], needed: dict[str, str]) -> list[str]:
    """Add to `plan` the stack the search stopped at and what it expects next (resolved here); returns the labels
    of every planned stack no round has run yet, the one it must run first."""
    from concurrent.futures import ThreadPoolExecutor

    label_needed = stack_label(needed) if "day" in needed else None
    phase = next((e.get("phase") for e in bisect.expected if stack_label(e) == label_needed), None)
    if phase == "bisect":
        # The probe it stopped at, then the probes the search may take after it, level by level.
        wanted = [needed, *bisect.expected]
    elif needed.get("package"):
        moves = [e for e in bisect.expected if e.get("phase") == "move"]
        moves = moves[next((i for i, m in enumerate(moves) if stack_label(m) == label_needed), 0) :]
        if bisect.search == "sweep":
            # A sweep's points are known before any run: the move it stopped at, every other move, then the sweep
            # points of the first two moves (the packages the traceback names first, where flips end), as far as the
            # resolutions (LOOKAHEAD) and the pack (64 MiB) go: a flip whose sweep finds its changes at the points
            # finishes in this round. Every move's sweep (a dependency's 20 releases too) cost 40 resolutions and
            # 10 min 45 s of planning for qlora-fsdp-trainer-checkpointing-gpu-sweep's round 2; these need 13.
            wanted = [needed, *moves[1:], *_bisect_of(bisect, moves[:2])]
        else:
            # A binary search's next probes depend on outcomes: the first move's whole bisect (the package the
            # traceback names first, where most flips end), then the second move.
            wanted = [needed, *_bisect_of(bisect, moves[:1]), *moves[1:2]]
    else:
        # The scan, then what the search would need next wherever two neighbouring days differ: a verdict in one
        # call where the pack and the node's time allow (the node replays the search and runs only what it needs).
        wanted = [{"day": d} for d in plan["ends"]] + scan_lookahead(bisect, atlas, plan["ends"])
    new: dict[str, dict[str, str]] = {}
    for request in wanted:
        label = stack_label(request)
        if label not in plan["stacks"] and label not in new:
            new[label] = request
    days = {label: r for label, r in new.items() if not r.get("package")}
    moves = dict(list((label, r) for label, r in new.items() if r.get("package"))[: 1 + LOOKAHEAD])
    extra = tuple(plan.get("extra", ()))
    resolve = _probe_resolver(atlas, extra)
    todo = {**moves, **(days if extra else {})}  # a day is the lock's own entry unless the script needs more
    with ThreadPoolExecutor(max_workers=RESOLVERS) as pool:  # uv and the index, not this machine's cores
        entries = dict(zip(todo, pool.map(resolve, todo.values()), strict=True))
    requires = _index_requires()
    entries |= {label: day_entry(atlas, r["day"], requires) for label, r in days.items() if label not in entries}
    for label in new:
        if label in entries:
            plan["stacks"][label] = entries[label] | {"round": plan["round"] + 1}
            bisect.say(f"  planned {label}")
    # The stack it must run first, then what it expects, in that order (lookahead of earlier rounds that the search
    # has passed by stays in the plan, not in the pack).
    order = dict.fromkeys(stack_label(r) for r in wanted)
    return [label for label in order if label in plan["stacks"] and not _ran(bisect, label, plan["stacks"][label])]


def scan_lookahead(bisect: ScriptBisect, atlas: NodeAtlas, days: list[str]) -> list[dict[str, str]]:
    """For each pair of neighbouring scan days, the stacks the search needs if that pair differs, likeliest first:
    each package that changed between them moved alone onto the older day (the atlas's packages in their order,
    those the script reaches only), every pair's moves before any sweep; then, per pair, the sweep points (or the
    first bisect probes) of its first move. `plan_round` resolves them as far as LOOKAHEAD and the pack allow."""
    import itertools

    per_pair: list[list[dict[str, str]]] = []
    for older, newer in itertools.pairwise(days):
        before = (atlas.lock["days"].get(older) or {}).get("resolved") or {}
        after = (atlas.lock["days"].get(newer) or {}).get("resolved") or {}
        per_pair.append([
            {"day": older, "package": p, "version": after[p], "newer": newer, "phase": "move"}
            | ({"old": before[p]} if before.get(p) else {})
            for p in atlas.axis
            if after.get(p) and before.get(p) != after.get(p)
        ])  # fmt: skip
    moves = [m for pair in per_pair for m in pair]
    return moves + [probe for pair in per_pair for probe in _bisect_of(bisect, pair[:1])]


def _probe_resolver(atlas: NodeAtlas, extra: tuple[str, ...]) -> Any:
    """request -> its era-lock entry over the node's torch: a day's own axis packages, or the older day with one
    package moved (as the atlas's own node flips resolve their probes), with the script's `extra` dependencies;
    or an entry saying why none resolves."""
    from harness.environments.envs import uv_binary
    from harness.versions import lock as era_lock
    from harness.versions.releases import index_url

    uv, requires = uv_binary(), era_lock.index_requires(index_url())
    overlaid = [*atlas.profile.era_packages, *(_name(line) for line in extra)]

    def resolve(request: dict[str, str]) -> dict[str, Any]:
        key = _cache_key(atlas, request, extra)
        cached = _cached_entry(key)
        if cached is not None:
            return cached
        entry = resolve_uncached(request)
        _keep_entry(key, entry)
        return entry

    def resolve_uncached(request: dict[str, str]) -> dict[str, Any]:
        older = atlas.lock["days"][request["day"]]["resolved"]
        pins = {p: older[p] for p in atlas.axis if p in older}
        held = {"torch": atlas.image["torch"]}
        try:
            if request.get("package"):
                resolved, way = era_lock.resolve_probe(
                    uv, pins, request["day"], request["newer"], request["package"], request["version"],
                    atlas.profile.python, held, extra,
                )  # fmt: skip
            else:
                lines = [*(f"{p}=={v}" for p, v in pins.items()), *extra]
                resolved = era_lock.resolve_day(uv, lines, request["day"], atlas.profile.python, held)
                way = "the day's own, with the script's dependencies"
        except era_lock.ResolutionFailed as exc:
            return era_lock.unresolved_entry(stack_label(request), atlas.image, exc)
        entry = era_lock.lock_entry(resolved, overlaid, atlas.image, requires)
        return entry | {"dependencies": way}

    return resolve


def _index_requires() -> Any:
    from harness.versions import lock as era_lock
    from harness.versions.releases import index_url

    return era_lock.index_requires(index_url())


def day_entry(atlas: NodeAtlas, day: str, requires: Any) -> dict[str, Any]:
    """A scan day's stack: the lock's own resolution of the day, overlaid with only what the script can reach and
    what that requires (the same versions the atlas ran; no DeepSpeed wheel for a script that never reaches it)."""
    from packaging.utils import canonicalize_name

    from harness.versions import lock as era_lock

    entry = dict(atlas.lock["days"][day])
    if atlas.needed is None or entry.get("error"):
        return entry
    node = {canonicalize_name(k): v for k, v in atlas.image["packages"].items()}
    overlay, reasons = era_lock.overlay_for(entry["resolved"], atlas.axis, node, requires, atlas.image["python"])
    return entry | {"overlay": overlay, "overlay_reasons": reasons, "dependencies": "the day's own, as far as reached"}


def _plan_cache() -> Path:
    """Where resolved stacks are kept between plans (and folders): `COMPAT_MATRIX_PLAN_CACHE`, else the user's
    cache. A stack resolves as the index had it on its day, so the same request gives the same entry."""
    return Path(os.environ.get("COMPAT_MATRIX_PLAN_CACHE", Path.home() / ".cache" / "compat-matrix" / "stacks"))


def _cache_key(atlas: NodeAtlas, request: dict[str, str], extra: tuple[str, ...]) -> str:
    import hashlib

    what = [
        {k: request.get(k) for k in ("day", "newer", "package", "version")},
        atlas.lock["days"][request["day"]]["resolved"],
        atlas.image,
        atlas.profile.python,
        sorted(atlas.profile.era_packages),
        list(extra),
        *(
            [atlas.axis] if atlas.needed is not None else []
        ),  # a key of a plan that pinned every package stays as it was
    ]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _cached_entry(key: str) -> dict[str, Any] | None:
    path = _plan_cache() / f"{key}.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None  # a torn file is resolved again


def _keep_entry(key: str, entry: dict[str, Any]) -> None:
    if entry.get("error"):
        return  # a failure may be the index's of the moment: resolved again next time
    folder = _plan_cache()
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{key}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(entry))
    temporary.replace(folder / f"{key}.json")


def _name(line: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(Requirement(line).name))


def _bisect_of(bisect: ScriptBisect, moves: list[dict[str, str]]) -> list[dict[str, str]]:
    """The release probes a move would need if it reproduced the flip, in the order the search may take them: a
    sweep's points (known before any run: a round carries all of them), or a binary search's probes level by
    level."""
    from harness.tools.release_search.flip_search import sweep_points
    from harness.tools.script_verdicts.script_bisect import search_order

    probes: list[dict[str, str]] = []
    for move in (m for m in moves if m.get("old")):
        after = bisect.source.releases(move["package"], move["old"], move["version"])
        candidates = [move["old"], *after]
        if bisect.search == "sweep":
            order = [v for v in sweep_points(candidates) if v not in (candidates[0], candidates[-1])]
        else:
            order = search_order(candidates, {candidates[0]: "before", candidates[-1]: "after"}, "before", "after")
        probes += [move | {"version": v, "phase": "bisect"} for v in order]
    return probes


def _ran(bisect: ScriptBisect, label: str, entry: dict[str, Any]) -> bool:
    if entry.get("error"):
        return True  # nothing to install: an install failure on both sides
    probe = Stack(label, None, {}, "planned", identity=identity(label, entry))
    return bisect.key_of(probe) in bisect.earlier


def pack_round(atlas: NodeAtlas, plan: dict[str, Any], labels: list[str], dest: Path, budget: int) -> list[str]:
    """The wheels of `labels` (the first must go; the rest while the pack fits `budget` bytes) in one solid pack;
    returns the labels it carries."""
    from harness.environments.wheel_pack import pack

    chosen = list(labels)
    while True:
        pack(round_wheels(atlas, {label: plan["stacks"][label] for label in chosen}), dest, fast=True)
        if dest.stat().st_size <= budget or len(chosen) == 1:
            return chosen
        chosen = chosen[: max(1, len(chosen) * 2 // 3)]


def round_wheels(atlas: NodeAtlas, stacks: dict[str, dict[str, Any]]) -> list[Path]:
    """The wheel files the node installs for `stacks` (era-lock entries), trimmed for its CUDA, from the cache."""
    from harness.environments import era_wheels
    from harness.environments.wheelhouse import DEFAULT_PLATFORMS

    cache = Path(os.environ.get("COMPAT_MATRIX_WHEEL_CACHE", Path.home() / ".cache" / "compat-matrix" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    lock = {"node": atlas.lock["node"], "days": stacks}
    wheels = era_wheels.build(lock, list(stacks), atlas.profile.python, DEFAULT_PLATFORMS, cache)
    return sorted({path for found in wheels.values() for path in found.values()})


def pack_folders(folders: list[Path], dest: Path) -> int:
    """`bisect-script-pack`: one pack carrying the planned round of several verdict folders, so that one device
    call runs them all (one `scripts/gpu-script-bisect.sh` per folder, the same pack). Refused if it does not fit."""
    from harness.define.profile import load_profile
    from harness.environments import era_wheels
    from harness.environments.wheel_pack import pack
    from harness.paths import MATRIX_DIR

    files: set[Path] = set()
    for folder in folders:
        if not (folder / PLAN).is_file():
            raise UsageError(f"{folder}: no {PLAN} (plan a round with bisect-script --device cuda first)")
        plan = json.loads((folder / PLAN).read_text())
        atlas = NodeAtlas.of(load_profile(plan["profile_path"], MATRIX_DIR))
        files |= set(round_wheels(atlas, {label: plan["stacks"][label] for label in plan["pack"]["stacks"]}))
    pack(sorted(files), dest, fast=True)
    free = era_wheels.CALL_LIMIT_BYTES - era_wheels.travelling_bytes(REPO_ROOT) - era_wheels.MARGIN_BYTES
    size = dest.stat().st_size
    print(f"packed the planned rounds of {len(folders)} folder(s): {len(files)} wheels, {size / 2**20:.1f} MiB "
          f"in {_relative(dest, REPO_ROOT)} ({free / 2**20:.1f} MiB may travel beside the tree)")  # fmt: skip
    if size > free:
        raise UsageError(f"{dest} does not fit one device call: pack fewer folders")
    print("on the node, one after the other in one call:")
    for folder in folders:
        print(f'  scripts/gpu-script-bisect.sh {_relative(folder, REPO_ROOT)} {_relative(dest, REPO_ROOT)} "$OUT"')
    return 0


def import_node_runs(
    out_dir: Path, returned: Path, plan: dict[str, Any], script_sha: str
) -> tuple[int, dict[str, Any] | None]:
    """Append the runs a node call made (its runs.jsonl beside call.json) to the verdict folder's runs, skipping
    any already there and a torn last line; record the call. Refuses a folder of another script or plan.
    Returns (runs added, the call)."""
    runs_file, call_file = returned / "runs.jsonl", returned / "call.json"
    if not runs_file.is_file() and not call_file.is_file():
        raise UsageError(f"--node-runs {returned}: no runs.jsonl or call.json (the folder a node call wrote in $OUT)")
    call = json.loads(call_file.read_text()) if call_file.is_file() else None
    if call is not None and call.get("plan_id") != plan.get("plan_id"):
        raise UsageError(f"--node-runs {returned}: that call ran another plan than {out_dir / PLAN}")
    runs = read_json_lines(runs_file)
    if any(r.get("script_sha256") != script_sha for r in runs):
        raise UsageError(f"--node-runs {returned}: its runs are of another script")
    local = out_dir / "runs.jsonl"
    have = {r["key"] for r in read_json_lines(local)}
    added = 0
    with open(local, "a") as handle:
        for data in runs:
            if data["key"] not in have:
                handle.write(json.dumps(data) + "\n")
                have.add(data["key"])
                added += 1
    if call is not None:
        calls = out_dir / CALLS
        seen = {c["call_id"] for c in read_json_lines(calls)}
        if call["call_id"] not in seen:
            with open(calls, "a") as handle:
                handle.write(json.dumps(call) + "\n")
    return added, call


def device_calls(out_dir: Path, plan_id: str | None) -> list[dict[str, Any]]:
    """The node calls that ran this plan (a plan made anew does not count the calls of the one before)."""
    return [c for c in read_json_lines(out_dir / CALLS) if c.get("plan_id") == plan_id]


def gpu_command(args: Any) -> int:
    """`bisect-script --device cuda`: import the last call's runs, replay the search over every run so far, then
    write the verdict, or the next round's plan and pack and the node's command."""
    from harness.define.profile import load_profile
    from harness.environments.envs import InstallOptions, default_envs_dir
    from harness.paths import MATRIX_DIR

    good, bad = checked_ends(args)
    out_dir = args.results_dir / SCRIPT_BISECT_FOLDER / (args.name or args.script.stem)

    if (good is not None and not good.day) or (bad is not None and not bad.day):
        raise UsageError("--device cuda scans the GPU atlas's days: --good and --bad must be days")
    atlas = replace(NodeAtlas.of(load_profile(args.profile, MATRIX_DIR)), needed=script_needs(args.script.read_text()))
    first = args.from_day or (min(good.day, bad.day) if good and bad else None)  # type: ignore[type-var]
    last = args.to_day or (max(good.day, bad.day) if good and bad else None)  # type: ignore[type-var]
    days = [d for d in atlas.days if (not first or d >= first) and (not last or d <= last)]
    for end in (good, bad):
        if end is not None and end.day not in atlas.days:
            raise UsageError(f"{end.day}: not a day of {atlas.profile.name}'s era lock ({', '.join(atlas.days)})")
    if len(days) < 2:
        raise UsageError(
            f"fewer than two days of {atlas.profile.name} between {first or 'the first'} and {last or 'the last'}"
        )
    if args.fresh and args.node_runs is not None:
        raise UsageError("--fresh sets aside the runs so far: import a node's runs (--node-runs) without it")
    out_dir.mkdir(parents=True, exist_ok=True)
    bisect = ScriptBisect(
        args.script, out_dir, atlas.profile, InstallOptions(envs_dir=default_envs_dir()), nproc=args.nproc,
        torchrun=args.torchrun, timeout_s=args.timeout, match=args.match, fresh=args.fresh,
        search="bisect" if args.bisect else "sweep",
    )  # fmt: skip
    plan_path = out_dir / PLAN
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    if args.fresh and (out_dir / CALLS).exists():
        # The calls of the runs set aside go with them (ScriptBisect set runs.jsonl aside the same way): a verdict
        # made anew counts only the device calls that made its own runs.
        (out_dir / CALLS).rename(out_dir / f"device-calls-{now_iso().replace(':', '')}.jsonl")
    launch = launch_of(bisect, atlas, args.all_moves)
    if plan is None or args.fresh or launch_planned(plan, atlas) != launch:
        if plan is not None and args.fresh:
            print(f"--fresh: planning anew from round {plan['round'] + 1} (the runs so far are set aside)")
        elif plan is not None:
            before = launch_planned(plan, atlas)
            said = ", ".join(f"{k} {before.get(k)} -> {v}" for k, v in launch.items() if before.get(k) != v)
            print(
                f"the launch changed since round {plan['round']} ({said}): planning anew (runs already made are kept)"
            )
        # The node runs the copy beside the plan: it travels with the tree wherever the script itself lives.
        copy = out_dir / "script.py"
        copy.write_bytes(args.script.read_bytes())
        plan = new_plan(bisect, atlas, _relative(copy, REPO_ROOT), days, bad.day if bad else None, launch)
    if args.node_runs is not None:
        added, call = import_node_runs(out_dir, args.node_runs, plan, bisect.script_sha)
        bisect.earlier = earlier_runs(bisect.runs_path)
        wall = f", {call['wall_s']:.0f} s on {call['device'].get('name') or call['device'].get('kind')}" if call else ""
        print(f"imported {added} new run(s) from {args.node_runs}{wall}")
    plan["ends"], plan["bad"] = days, bad.day if bad else None
    bisect.source = PlannedStacks(plan, bisect)
    bisect.device_calls = device_calls(out_dir, plan.get("plan_id"))
    for _ in range(MAX_REPLAYS):
        try:
            verdict = run(bisect, [End(day=d) for d in days], bad, all_moves=args.all_moves)
        except Unplanned as stop:
            pending = plan_round(bisect, atlas, plan, stop.request)
            if pending:
                return _next_round(args, bisect, atlas, plan, pending, out_dir)
            bisect.observations.clear()  # what it stopped at needs no node (a stack that cannot resolve): again
            continue
        plan_path.write_text(json.dumps(plan, indent=1) + "\n")
        return write_issue(verdict, bisect)
    raise UsageError(f"the search did not settle in {MAX_REPLAYS} replays over {out_dir}: a harness bug, please report")


def _next_round(
    args: Any, bisect: ScriptBisect, atlas: NodeAtlas, plan: dict[str, Any], pending: list[str], out_dir: Path
) -> int:
    """Pack the round's wheels (unless the same round is packed already), write the plan, say what to run."""
    from harness.environments import era_wheels

    plan_path = out_dir / PLAN
    packed = plan.get("pack") or {}
    current = REPO_ROOT / packed.get("file", "")
    still = bool(packed) and set(pending) <= set(packed["stacks"]) and current.is_file()
    if still and (not args.pack or args.pack.resolve() == current.resolve()):
        # Asked again before the node ran it, or after a call the round's time cut short: what is left of the
        # round is in its pack already, so the same pack goes again (no new round).
        pack = REPO_ROOT / packed["file"]
        carried = packed["stacks"]
        plan["pending"] = pending
    else:
        plan["round"] += 1
        pack = args.pack or REPO_ROOT / ".gpu-pack" / f"{out_dir.name}-round{plan['round']}.tar.xz"
        free = era_wheels.CALL_LIMIT_BYTES - era_wheels.travelling_bytes(REPO_ROOT) - era_wheels.MARGIN_BYTES
        carried = pack_round(atlas, plan, pending, pack, free)
        plan["pack"] = {"file": _relative(pack, REPO_ROOT), "bytes": pack.stat().st_size, "stacks": carried}
        plan["pending"] = pending
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    shown = _relative(out_dir, REPO_ROOT)
    print(
        f"\nround {plan['round']}: {len(carried)} stack(s) for the node ({', '.join(carried)}), wheels "
        f"{pack.stat().st_size / 2**20:.1f} MiB in {_relative(pack, REPO_ROOT)}; plan {_relative(plan_path, REPO_ROOT)}"
    )
    print("on the node (carry the pack; the plan travels with the tree):")
    print(f'  scripts/gpu-script-bisect.sh {shown} {_relative(pack, REPO_ROOT)} "$OUT"')
    print("then here, with the folder it wrote:")
    print(f"  compat-matrix bisect-script {args.script} --device cuda --nproc {bisect.nproc} "
          f"--name {out_dir.name}{_span(args)} --node-runs OUT/{out_dir.name}")  # fmt: skip
    return 0


def own_dependencies(extras: list[str], atlas: NodeAtlas, days: list[str]) -> list[str]:
    """The script's PEP 723 dependencies that some scanned day's stack (with the node's own packages) does not
    meet: those days and every probe are resolved again with them."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    node = {str(canonicalize_name(n)): v for n, v in atlas.image.get("packages", {}).items()}
    unmet = []
    for line in extras:
        wanted = Requirement(line)
        name = str(canonicalize_name(wanted.name))
        for day in days:
            have = atlas.lock["days"][day].get("resolved", {}).get(name) or node.get(name)
            if have is None or not wanted.specifier.contains(have, prereleases=True):
                unmet.append(line)
                break
    return unmet


def _span(args: Any) -> str:
    parts = [f" --{flag} {value}" for flag, value in (("from", args.from_day), ("to", args.to_day)) if value]
    parts += [f" --{flag} {value}" for flag, value in (("good", args.good), ("bad", args.bad)) if value]
    parts += [f" --timeout {args.timeout:g}"] if args.timeout != 600 else []
    parts += [f" --match {shlex.quote(args.match)}"] if args.match else []
    parts += [" --torchrun"] if args.torchrun else []
    return "".join(parts) + (f" --profile {args.profile}" if args.profile != "gpu-history-ws2" else "")


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)
