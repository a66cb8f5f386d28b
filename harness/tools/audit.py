"""`compat-matrix audit`: a lockfile and a setup in, the known failures that apply out, as a CI gate (pip-audit's
conventions: `--format columns|json|markdown`, `--ignore-id`, exit 1 when an advisory applies, 0 when none does, 2 on
bad input).

It reads what the user has (`requirements.txt` with exact pins or a `pip freeze`, `uv.lock`, `pylock.toml`,
`poetry.lock`, or an environment: this one with `--env`, another with `--python`) and their setup (the YAML that
`accelerate config` writes, a DeepSpeed JSON, or `--setup fsdp1,lora`), and judges each advisory of
`results/advisories/` (`publishing/advisories.py`) by its conjunction of conditions (every package's range), its setups
and the releases the atlas measured:
- **applies**: every condition holds and each release lies where the records decide it;
- **undecided**: a release lies where the atlas measured nothing (outside the releases measured for that failure, or
  between the two releases a change was found between); never reported as clean: `lookup --measure` measures it;
- not applicable: another setup, a package the user does not have, or a release outside a range.
For each advisory that applies it prints the way out: the smallest upgrade (or the downgrade) of a package that leaves
every applicable advisory, and the workarounds measured where no release ends it.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from harness.errors import UsageError
from harness.paths import RESULTS_DIR
from harness.versions.matching import release_key
from scenarios.fix_words import fix_words

FORMATS = ("columns", "json", "markdown")
CLEARED = "which the records show passing where it failed"


# --- what the user has ---------------------------------------------------------------------------------------------


def read_pins(path: Path) -> tuple[dict[str, str], list[str]]:
    """(package -> exact version, requirements that pin no exact version) from a lockfile or requirements file; a
    file that cannot be read is bad input naming its line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    if path.suffix == ".lock" or path.suffix == ".toml":
        return _toml_pins(path, text), []
    return _requirement_pins(path, text)


def _toml_pins(path: Path, text: str) -> dict[str, str]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not a lockfile: {exc}") from None
    entries = data.get("package") or data.get("packages")  # uv.lock, poetry.lock: [[package]]; PEP 751: [[packages]]
    if not isinstance(entries, list):
        raise UsageError(f"{path}: no [[package]] or [[packages]] table: not a uv, poetry or PEP 751 lock")
    pins = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or "name" not in entry:
            raise UsageError(f"{path}: package entry {number} has no name")
        if entry.get("version"):
            pins[str(canonicalize_name(entry["name"]))] = str(entry["version"])
    return pins


def loose_ranges(loose: list[str]) -> dict[str, Any]:
    """package -> the SpecifierSet a requirement that pins no release allows ('transformers>=4.41,<=4.45.2')."""
    found = {}
    for line in loose:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        found[str(canonicalize_name(requirement.name))] = requirement.specifier
    return found


def _requirement_pins(path: Path, text: str) -> tuple[dict[str, str], list[str]]:
    pins, loose = {}, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-", "--")):
            continue  # comments, options (-r, -e, --index-url, --hash continuations)
        if " @ " in line or line.startswith(("git+", "http", "file:", ".", "/")):
            loose.append(line)  # a direct reference: no release to look up
            continue
        try:
            requirement = Requirement(line.rstrip("\\").strip())
        except InvalidRequirement as exc:
            why = str(exc).splitlines()[0]
            raise UsageError(f"{path}:{number}: {raw.strip()!r} is not a requirement ({why})") from None
        exact = [s for s in requirement.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if exact:
            pins[str(canonicalize_name(requirement.name))] = exact[0].version
        else:
            loose.append(str(requirement))
    return pins, loose


def environment_pins(python: str | None = None) -> dict[str, str]:
    """What an environment has installed: this interpreter's (`--env`), or another's (`--python`)."""
    if python:
        from harness.environments.envs import installed_versions

        found = installed_versions(Path(python))
        return {str(canonicalize_name(k)): str(v) for k, v in found.items() if k != "python"}
    from importlib import metadata

    return {
        str(canonicalize_name(d.metadata["Name"])): d.version for d in metadata.distributions() if d.metadata["Name"]
    }


# --- their setup ---------------------------------------------------------------------------------------------------


def read_setup(accelerate: Path | None, deepspeed: Path | None, words: list[str]) -> dict[str, str]:
    """The setup as the advisories' keys name it (engine, adapter, path), from an `accelerate config` YAML, a DeepSpeed
    JSON and `--setup` words (the words win)."""
    setup: dict[str, str] = {}
    if accelerate is not None:
        setup |= _accelerate_setup(accelerate)
    if deepspeed is not None:
        try:
            stage = json.loads(deepspeed.read_text()).get("zero_optimization", {}).get("stage")
        except (OSError, ValueError) as exc:
            raise UsageError(f"{deepspeed}: not a DeepSpeed JSON config: {exc}") from None
        if stage is not None:
            setup["engine"] = f"zero{stage}"
    from harness.define.setup import parse_words

    return setup | parse_words(words)


def _accelerate_setup(path: Path) -> dict[str, str]:
    """distributed_type and fsdp_config.fsdp_version of an `accelerate config` YAML (a flat 'key: value' file, one
    level of nesting), read without a YAML library."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    flat: dict[str, str] = {}
    parent = ""
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if ":" not in raw:
            raise UsageError(f"{path}:{number}: {raw.strip()!r} is not 'key: value' (an accelerate config YAML?)")
        key, _, value = raw.partition(":")
        indented = raw.startswith((" ", "\t"))
        name = key.strip()
        if not indented:
            parent = name if not value.strip() else ""
            flat[name] = value.strip().strip("'\"")
        else:
            flat[f"{parent}.{name}"] = value.strip().strip("'\"")
    kind = flat.get("distributed_type", "").upper()
    if not kind:
        raise UsageError(f"{path}: no distributed_type: not an accelerate config YAML")
    precision = {"mixed_precision": flat["mixed_precision"]} if flat.get("mixed_precision") else {}
    if kind == "FSDP":
        version = flat.get("fsdp_config.fsdp_version", "1") or "1"
        found = {"engine": "fsdp2" if version.strip() == "2" else "fsdp1"} | precision
        state_dict = flat.get("fsdp_config.fsdp_state_dict_type", "").upper()
        if state_dict in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            found["state_dict"] = state_dict.lower()  # the setup of S7's saves and S9's fixes
        return found
    if kind == "DEEPSPEED":
        stage = flat.get("deepspeed_config.zero_stage", "")
        return {"engine": f"zero{stage}"} if stage else {}
    if kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"):
        return {"engine": "ddp"}
    return {}


# --- judging -------------------------------------------------------------------------------------------------------


@dataclass
class Finding:
    advisory: dict[str, Any]
    state: str  # "applies" | "undecided" | "range" (a loose requirement admits it) | "cleared" (the setup has its fix)
    why: str
    way_out: list[str] = field(default_factory=list)
    sure: str = ""  # how sure: measured at these exact releases, or what to run to measure them


def affected(events: list[dict[str, str]], version: str) -> bool:
    """OSV's ECOSYSTEM range: the last event at or below `version` is an `introduced` one."""
    state = False
    for event in sorted(events, key=lambda e: release_key(next(iter(e.values())))):
        kind, at = next(iter(event.items()))
        if release_key(at) > release_key(version):
            break
        state = kind == "introduced"
    return state


def judge(
    advisory: dict[str, Any],
    pins: dict[str, str],
    setup: dict[str, str],
    ranges: dict[str, Any] | None = None,
    partial: bool = False,
    gpus: int | None = None,
) -> Finding | None:
    """An advisory against the user's releases and setup: applies, undecided, admitted by a range the user allows
    ("range": a requirement that pins no release, whose range holds an affected release the atlas measured), or None
    (does not apply). `partial`: the input is a requirements file, which need not name every package installed (torch
    is often installed apart), so a package it does not name is undecided, not absent. `gpus`: how many GPUs the user
    trains on (0: a CPU run, where what was measured on GPUs does not apply; N: an advisory measured on GPUs at other
    world sizes only is undecided); None: every advisory, by releases and setup alone."""
    facts = advisory["database_specific"]
    if gpus == 0 and facts["device"] != "cpu":
        return None
    if setup and facts.get("setup_keys") and not any(_same_setup(keys, setup) for keys in facts["setup_keys"]):
        return None
    if _cleared_by(facts, setup):
        return None
    undecided, admitted = [], []
    for condition in facts["conditions"]:
        package, events = condition["package"], condition["events"]
        have = pins.get(package)
        if have is None and package in (ranges or {}):
            allowed_by = (ranges or {})[package]
            allowed = [v for v in facts.get("measured", {}).get(package, []) if allowed_by.contains(v)]
            bad = [v for v in allowed if affected(events, v)]
            if bad:
                admitted.append(f"{package} {allowed_by or '(any)'} admits {', '.join(bad)}")
                continue
            if allowed:
                return None
            undecided.append(f"{package} {allowed_by or '(any)'} holds no release measured for it")
            continue
        if have is None and partial:
            undecided.append(f"{package} is not in your files (installed apart? give its release: a lock, --env)")
            continue
        if have is None:
            return None  # a lock or an environment without the package: the failure cannot happen
        gap = _unmeasured(facts, package, have)
        if gap:
            undecided.append(gap)
            continue
        if not affected(events, have):
            return None
    sizes = facts.get("world_size") or []
    if gpus and facts["device"] != "cpu" and sizes and gpus not in sizes:
        undecided.append(f"measured on {' and '.join(map(str, sizes))} GPUs, not on {gpus}")
    if undecided:
        return Finding(advisory, "undecided", "; ".join(undecided), sure=_to_measure(facts, pins))
    if admitted:
        return Finding(
            advisory, "range", "; ".join(admitted), sure="a range you allow admits a release measured failing"
        )
    have = ", ".join(f"{c['package']} {pins[c['package']]}" for c in facts["conditions"])
    return Finding(advisory, "applies", have, sure=_sureness(facts, pins))


def _sureness(facts: dict[str, Any], pins: dict[str, str]) -> str:
    """'measured at these exact releases', or which of them no record holds (the range around them says it fails)."""
    off = [
        f"{c['package']} {pins[c['package']]}"
        for c in facts["conditions"]
        if not any(
            release_key(m) == release_key(pins[c["package"]]) for m in facts.get("measured", {}).get(c["package"], [])
        )
    ]
    if not off:
        return "measured at these exact releases"
    return (
        f"not measured at {', '.join(off)} exactly (the releases measured around it fail): {_to_measure(facts, pins)}"
    )


def _to_measure(facts: dict[str, Any], pins: dict[str, str]) -> str:
    asked = " ".join(f"{c['package']}=={pins[c['package']]}" for c in facts["conditions"] if c["package"] in pins)
    return f"run `compat-matrix lookup {asked + ' ' if asked else ''}--scenario {facts['scenario']} --measure`"


def _cleared_by(facts: dict[str, Any], setup: dict[str, str]) -> str | None:
    """The fix the user's setup already has (`fsdp_state_dict_type: SHARDED_STATE_DICT`) where the records show it
    passing on these configs while their baseline failed: the advisory is not theirs."""
    for fix in facts.get("workarounds", []):
        wanted = fix.get("setup") or {}
        if wanted and all(setup.get(k) == v for k, v in wanted.items()):
            return str(fix["variant"])
    return None


def cleared(
    every: list[dict[str, Any]], pins: dict[str, str], setup: dict[str, str], gpus: int | None = None
) -> list[tuple[str, str]]:
    """(advisory id, fix) for each advisory the releases alone would report that the setup's own settings clear."""
    found = []
    for advisory in every:
        fix = _cleared_by(advisory["database_specific"], setup)
        if fix and judge(advisory, pins, {k: v for k, v in setup.items() if k != "state_dict"}, gpus=gpus) is not None:
            found.append((advisory["id"], fix))
    return found


def _same_setup(keys: dict[str, str], setup: dict[str, str]) -> bool:
    """Whether one of the advisory's setups is the user's: every key both name agrees."""
    return all(keys[k] == v for k, v in setup.items() if k in keys)


def _unmeasured(facts: dict[str, Any], package: str, have: str) -> str:
    """Why the atlas cannot decide `package` at `have` for this failure ('' where it can): outside the releases
    measured for it, or strictly between the two releases a change was found between."""
    measured = sorted(facts.get("measured", {}).get(package) or [], key=release_key)
    if not measured:
        return ""
    key = release_key(have)
    if key < release_key(measured[0]) or key > release_key(measured[-1]):
        return f"{package} {have} lies outside the releases measured for it ({measured[0]} to {measured[-1]})"
    for entry in facts.get("evidence", []):
        if entry["package"] != package:
            continue
        for event in entry["events"]:
            release = event.get("introduced") or event.get("fixed")
            if event.get("bound") == "earliest measured" and release and key < release_key(release):
                return (f"{package} {have} is older than {release}, the oldest release this failure was measured "
                        "with (older ones ran only under other releases of the rest)")  # fmt: skip
            before = (event.get("before") or {}).get("release")
            if release and before and release_key(before) < key < release_key(release):
                return f"{package} {have} lies between {before} and {release}, where the change was found, unmeasured"
    return ""


def ways_out(
    findings: list[Finding],
    pins: dict[str, str],
    every: list[dict[str, Any]],
    setup: dict[str, str],
    gpus: int | None = None,
) -> None:
    """For each applying advisory: the smallest upgrade of one of its packages that leaves it and brings no other
    advisory to apply, else the last release measured good before it came (a downgrade), and the workarounds."""
    now = _applying(every, pins, setup, gpus)
    for finding in (f for f in findings if f.state == "applies"):
        facts = finding.advisory["database_specific"]
        for condition in facts["conditions"]:
            package, events = condition["package"], condition["events"]
            fixes = sorted(
                (e["fixed"] for e in events if "fixed" in e and release_key(e["fixed"]) > release_key(pins[package])),
                key=release_key,
            )
            clear = None
            for fix in fixes:
                after = _applying(every, pins | {package: fix}, setup, gpus)
                if finding.advisory["id"] not in after and after <= now:
                    clear = fix
                    break
            if clear:
                finding.way_out.append(f"upgrade {package} to {clear}")
                continue
            before = _measured_good_before(facts, package, pins[package])
            if before:
                finding.way_out.append(f"no release of {package} after yours ends it: pin {package} {before}")
            else:
                finding.way_out.append(f"no measured release of {package} ends it")
        changes = sorted(facts.get("workarounds", []), key=lambda w: w.get("kind") != "fix")
        finding.way_out += [f"{w['kind']}: {w.get('words') or fix_words(w['variant'])}" for w in changes[:3]]
        if len(changes) > 3:
            finding.way_out.append(f"{len(changes) - 3} more measured changes in {finding.advisory['id']}.json")


def _applying(
    every: list[dict[str, Any]], pins: dict[str, str], setup: dict[str, str], gpus: int | None = None
) -> set[str]:
    return {a["id"] for a in every if (f := judge(a, pins, setup, gpus=gpus)) is not None and f.state == "applies"}


def _measured_good_before(facts: dict[str, Any], package: str, have: str) -> str | None:
    """The release measured good right before the `introduced` event that covers `have` (its `before`)."""
    for entry in facts.get("evidence", []):
        if entry["package"] != package:
            continue
        covering = [
            e for e in entry["events"] if "introduced" in e and release_key(e["introduced"]) <= release_key(have)
        ]
        before = (covering[-1].get("before") or {}) if covering else {}
        # Only a release the records measured passing is one to pin (before S1's onset peft 0.11 failed otherwise).
        if before.get("records") and all(r["outcome"] == "pass" for r in before["records"]):
            return before["release"]
    return None


# --- the command ---------------------------------------------------------------------------------------------------


#: Where a wheel install (a pre-commit hook, a CI job's `pip install`) keeps the advisories of the commit it was built
#: from (pyproject's force-include); a checkout reads results/advisories.
PACKAGED = Path(__file__).resolve().parents[1] / "advisories_feed"


def load_advisories(results_dir: Path) -> list[dict[str, Any]]:
    folder = results_dir / "advisories"
    if not (folder / "index.json").is_file() and results_dir == RESULTS_DIR and (PACKAGED / "index.json").is_file():
        folder = PACKAGED
    index = folder / "index.json"
    if not index.is_file():
        raise UsageError(f"no {index}: run `nox -s report` first")
    from harness.publishing.advisories import read

    return read(folder)


def audit(
    results_dir: Path,
    pins: dict[str, str],
    setup: dict[str, str],
    ignore: list[str],
    device: str | None = None,
    ranges: dict[str, Any] | None = None,
    partial: bool = False,
    gpus: int | None = None,
) -> list[Finding]:
    every = [a for a in load_advisories(results_dir) if a["id"] not in ignore]
    if device:
        every = [a for a in every if a["database_specific"]["device"] == device]
    found = [f for a in every if (f := judge(a, pins, setup, ranges, partial, gpus)) is not None]
    ways_out(found, pins, every, setup, gpus)
    by_id = {a["id"]: a for a in every}
    found += [
        Finding(by_id[advisory], "cleared", f"your setup has {fix_words(fix)}, {CLEARED}")
        for advisory, fix in cleared(every, pins, setup, gpus)
    ]
    order = {"applies": 0, "undecided": 1, "range": 2, "cleared": 3}
    return sorted(found, key=lambda f: (order.get(f.state, 3), f.advisory["id"]))


def render(findings: list[Finding], fmt: str, loose: list[str]) -> str:
    if fmt == "json":
        return json.dumps(
            [{"id": f.advisory["id"], "state": f.state, "summary": f.advisory["summary"], "why": f.why,
              "sure": f.sure, "setups": f.advisory["database_specific"]["setups"], "way_out": f.way_out}
             for f in findings],
            indent=1,
        )  # fmt: skip
    applies = [f for f in findings if f.state == "applies"]
    undecided = [f for f in findings if f.state == "undecided"]
    admitted = [f for f in findings if f.state == "range"]
    settled = [f for f in findings if f.state == "cleared"]
    if fmt == "markdown":
        lines = ["| advisory | state | what | setups | way out |", "|---|---|---|---|---|"]
        for f in findings:
            setups = "; ".join(f.advisory["database_specific"]["setups"])
            way = "; ".join(f.way_out) or f.why
            lines.append(f"| {f.advisory['id']} | {f.state} | {f.advisory['summary']} | {setups} | {way} |")
        return "\n".join(lines)
    lines = []
    for f in findings:
        facts = f.advisory["database_specific"]
        lines.append(f"{f.state.upper():10} {f.advisory['id']}  {f.advisory['summary']}")
        if f.state == "cleared":
            lines.append(f"           {f.why}")
            continue
        lines.append(
            f"           when: {'; '.join(facts['setups']) or 'any setup'} ({facts['device']}); "
            f"{'you have' if f.state == 'applies' else 'because'} {f.why}"
        )
        if f.sure and f.state != "undecided":
            lines.append(f"           how sure: {f.sure}")
        for way in f.way_out:
            lines.append(f"           way out: {way}")
        if f.state in ("undecided", "range"):
            lines.append("           measure it: compat-matrix lookup PACKAGE==VERSION ... --scenario "
                         f"{facts['scenario']} --measure")  # fmt: skip
    if loose:
        lines.append(f"not pinned exactly (not judged): {', '.join(loose)}")
    lines.append(
        f"{len(applies)} advisor{'y applies' if len(applies) == 1 else 'ies apply'}, {len(undecided)} undecided, "
        f"{len(admitted)} admitted by a range you allow (pin exact releases to decide them)"
        + (f", {len(settled)} cleared by your setup" if settled else "")
    )
    return "\n".join(lines)


def command(args: Any) -> int:
    if sum(bool(x) for x in (args.files, args.env, args.python)) != 1:
        raise UsageError("give one of: lockfiles or requirements files, --env, or --python PATH")
    if args.files:
        pins, loose = {}, []
        for path in args.files:
            found, unpinned = read_pins(path)
            pins |= found
            loose += unpinned
    else:
        pins, loose = environment_pins(args.python), []
    if args.gpus is not None and args.gpus < 0:
        raise UsageError(f"--gpus {args.gpus}: give 0 (a CPU run) or how many GPUs you train on")
    setup = read_setup(args.accelerate_config, args.deepspeed_config, args.setup or [])
    partial = any(Path(p).suffix not in (".lock", ".toml") for p in args.files or [])
    found = audit(
        args.results_dir, pins, setup, args.ignore_id or [], args.device, loose_ranges(loose), partial, args.gpus
    )
    print(render(found, args.format, loose))
    return 1 if any(f.state == "applies" for f in found) else 0
