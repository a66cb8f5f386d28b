"""`compat-matrix audit`: a lockfile and a setup in, the known failures that apply out, as a CI gate (pip-audit's
conventions: `--format columns|json|markdown`, `--ignore-id`, exit 1 when an advisory applies, 0 when none does, 2 on
bad input). It is a view of the one judge (`knowledge/judge.py`), over the tables written beside the advisories.

It reads what the user has (`requirements.txt` with exact pins or a `pip freeze`, `uv.lock`, `pylock.toml`,
`poetry.lock`, or an environment: this one with `--env`, another with `--python`) and their setup (the YAML that
`accelerate config` writes, a DeepSpeed JSON, or `--setup fsdp1,lora`), asks the judge about every known failure, and
prints each answer that concerns the user: APPLIES (exit 1), APPLIES IF (a condition on their model no lockfile shows:
exit 1 only under `--strict`), RANGE (a range they allow admits a release measured failing), UNDECIDED (their releases
lie where nothing was measured: never clean; with the command that measures them), PITFALL (their setup fails on every
release measured) and CLEARED (their setup already has the measured fix), each with how sure it is. Then the one
recommended set of pins (`knowledge/ways_out.py`): the fewest release moves that leave nothing applying, judged again
over every failure, and per failure what one move of each of its packages ends and brings.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.errors import UsageError
from harness.knowledge.judge import Query, evaluate, fix_answers
from harness.knowledge.store import Store
from harness.knowledge.ways_out import way_out
from harness.paths import ADVISORIES_FOLDER, RESULTS_DIR
from harness.publishing.advisories import JUDGE_FILE, read_tables
from harness.tools.user_files.pins import Pins, environment_pins, loose_ranges, read_all, requirement_name
from harness.tools.user_files.requirements_edit import Moved, move
from harness.tools.user_files.target import here, target_of
from harness.tools.user_files.user_configs import UserSetup, read_setup
from harness.tools.user_files.user_configs import line as config_line
from harness.tools.user_files.user_text import read_text

FORMATS = ("columns", "json", "markdown")


# --- judging -------------------------------------------------------------------------------------------------------

#: What each state is called in the columns.
LABELS = {"applies": "APPLIES", "applies-if": "APPLIES IF", "range": "RANGE", "undecided": "UNDECIDED",
          "pitfall": "PITFALL", "cleared": "CLEARED"}  # fmt: skip
SHOWN = tuple(LABELS)


@dataclass
class Report:
    """The judge's answers that concern the user (`answers`; `every` answer for the way out), the tables they came
    from, and the one recommended way out, searched when it is first asked for."""

    answers: list[dict[str, Any]]
    tables: dict[str, Any]
    query: Query
    every: list[dict[str, Any]] = field(default_factory=list)
    loose: list[str] = field(default_factory=list)
    #: The requirements files read (a way out is printed as a diff of one; none for lockfiles and environments).
    requirements: list[Path] = field(default_factory=list)
    #: Print the way out in full (a requirements diff and the install lines), as `--fix` asks.
    fix: bool = False
    #: What was read: each file (`FileRead.as_json`), each config (`UserSetup.configs`), the target machine.
    inputs: list[dict[str, Any]] = field(default_factory=list)
    configs: list[dict[str, Any]] = field(default_factory=list)
    target: dict[str, str] = field(default_factory=dict)
    #: The target machine's marker variables (a requirement whose marker does not hold there is not moved).
    markers: dict[str, str] = field(default_factory=dict)
    _fixes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @cached_property
    def way_out(self) -> dict[str, Any]:
        return way_out(self.tables, self.query, self.every)

    def failure(self, failure_id: str) -> dict[str, Any]:
        return next(f for f in self.tables["failures"] if f["id"] == failure_id)

    def fixes(self, failure_id: str) -> list[dict[str, Any]]:
        """The failure's measured fixes, each judged at the user's releases, setup and GPU count (most sure first),
        with the command that measures it here where it was not."""
        if failure_id not in self._fixes:
            failure = self.failure(failure_id)
            judged = fix_answers(self.tables, failure, self.query)
            for fix in judged:
                if fix["state"] == "unmeasured":
                    fix["measure"] = measure_argv(failure, self.query)
                    fix["measure_on"] = measure_place(failure, self.query)
            self._fixes[failure_id] = judged
        return self._fixes[failure_id]

    def gate(self, strict: bool = False) -> int:
        """pip-audit's exit code: 1 where a failure applies (or applies if, under --strict), else 0."""
        failing = ("applies", "applies-if") if strict else ("applies",)
        return 1 if any(a["state"] in failing for a in self.answers) else 0


#: Where a wheel install (a pre-commit hook, a CI job's `pip install`) keeps the advisories of the commit it was built
#: from (pyproject's force-include); a checkout reads results/advisories.
PACKAGED = Path(__file__).resolve().parents[2] / "advisories_feed"


def load_tables(results_dir: Path) -> dict[str, Any]:
    """The judge's tables written with the advisories (a checkout's, else the ones packaged in the wheel)."""
    folder = results_dir / ADVISORIES_FOLDER
    if not (folder / JUDGE_FILE).is_file() and results_dir == RESULTS_DIR and (PACKAGED / JUDGE_FILE).is_file():
        folder = PACKAGED
    if not (folder / JUDGE_FILE).is_file():
        raise UsageError(f"no {folder / JUDGE_FILE}: run `nox -s report` first")
    tables = read_tables(folder)
    if measured_since(results_dir, tables):
        return tables_from_records(results_dir)
    return tables


def measured_since(results_dir: Path, tables: dict[str, Any]) -> bool:
    """Whether a run was measured here (`lookup --measure`, `audit --fix --measure`) that the tables were not
    compiled with (a new run, or one that holds more records now): then the judge reads the records themselves, so
    the next audit of those pins answers from that run."""
    compiled = tables.get("measured_runs", {})
    return any(compiled.get(run) != held for run, held in Store(results_dir).measured_runs.items())


def tables_from_records(results_dir: Path) -> dict[str, Any]:
    from harness.define.registry import discover
    from harness.knowledge.atlas import Atlas

    return Atlas(results_dir, {s.id: s.spec for s in discover()}).tables


def audit(tables: dict[str, Any], query: Query) -> Report:
    """The judge's answers for the query (those that concern the user) and the way out over all of them."""
    answers = evaluate(tables, query)
    return Report([a for a in answers if a["state"] in SHOWN], tables, query, answers)


def query_of(
    tables: dict[str, Any],
    pins: dict[str, str],
    setup: dict[str, str],
    loose: list[str],
    partial: bool,
    gpus: int | None,
    device: str | None,
    ignore: list[str],
) -> Query:
    """The judge's question: the pins, the releases the atlas measured that each loose requirement admits, the setup,
    and where it trains (`--gpus 0` is a CPU run; N GPUs a GPU run; `--device` says it without a count)."""
    ranges = {}
    for package, specifier in loose_ranges(loose).items():
        ranges[package] = [v for v in tables["releases"].get(package, []) if specifier.contains(v)]
    where = device or ("cpu" if gpus == 0 else "cuda" if gpus else None)
    return Query(dict(pins), dict(setup), where, gpus, partial, [], ranges, list(ignore))


# --- output --------------------------------------------------------------------------------------------------------


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(as_json(report), indent=1)
    if fmt == "markdown":
        return markdown(report)
    return "\n".join(columns(report))


#: The version of `--format json`'s shape (audit.schema.json beside this module): a new field is a minor step, a
#: field that changes or goes a major one.
SCHEMA_VERSION = "1.0"
SCHEMA_FILE = Path(__file__).with_name("audit.schema.json")


def as_json(report: Report) -> dict[str, Any]:
    """Structured, for tools (its shape: audit.schema.json, documented in docs/advisories-and-audit.md): what was read
    (each file's releases, each config's setup, the target machine), each answer with its failure's packages, labelled
    affected ranges, fixed-in releases, setups, how sure, the evidence and the command that measures it (an argv),
    the one way out and the totals."""
    found = []
    for answer in report.answers:
        entry = {k: answer.get(k) for k in ("id", "scenario", "device", "state", "why", "sure", "when")}
        if answer["state"] != "pitfall":
            failure = report.failure(answer["id"])
            entry |= {
                "summary": _summary(failure),
                "packages": failure["conditions"],
                "fixed_in": {
                    p: [e["release"] for e in events if e["kind"] == "fixed"] for p, events in failure["events"].items()
                },
                "affected": {
                    p: [_labelled(s) for s in failure["segments"][p] if s[4] == "affected"]
                    for p in failure["conditions"]
                },
                "setups": [s["words"] for s in failure["setups"]],
                "applies_if": failure["detail"],
                "fixes": report.fixes(answer["id"]),
                "evidence": answer.get("evidence") or [],
                "measure": measure_argv(failure, report.query),
                "measure_on": measure_place(failure, report.query),
            }
        else:
            entry |= {"way_out": answer.get("way_out")}
        found.append(entry)
    pins = report.way_out.get("pins") or {}
    install = dict(zip(("uv", "pip"), install_lines(pins), strict=True)) if pins else {}
    if pins:
        install["diff"] = [line[2:] for line in _diff(report, pins)]
    query = report.query
    return {"schema_version": SCHEMA_VERSION, "target": report.target, "inputs": report.inputs,
            "configs": report.configs, "asked": {"versions": dict(query.versions), "setup": dict(query.setup),
                                                 "device": query.device, "gpus": query.gpus, "partial": query.partial},
            "answers": found, "way_out": report.way_out | {"install": install}, "totals": _totals(report),
            "not_judged": report.loose}  # fmt: skip


def _labelled(segment: list[Any]) -> dict[str, Any]:
    """A segment of a failure's release line as an object: from `low` to `high` (None: unbounded), each end included
    or not, its state and why."""
    low, low_in, high, high_in, state, why = segment[:6]
    return {"from": low, "from_included": bool(low_in), "to": high, "to_included": bool(high_in), "state": state,
            "why": why}  # fmt: skip


def _summary(failure: dict[str, Any]) -> str:
    where = "on GPUs" if failure["device"] == "cuda" else "on CPU"
    return f"{failure['scenario']}: {failure['title']} ({where})"


def _totals(report: Report) -> dict[str, int]:
    return {state: sum(1 for a in report.answers if a["state"] == state) for state in SHOWN}


def totals_line(report: Report) -> str:
    counts = _totals(report)
    said = [f"{n} {LABELS[s].lower()}" for s, n in counts.items() if n]
    return "; ".join(said) if said else "no known failure concerns these releases and this setup"


#: Each kind of input, in words.
INPUT_WORDS = {"requirements": "a requirements file", "uv.lock": "a uv.lock", "pylock.toml": "a PEP 751 pylock.toml",
               "poetry.lock": "a poetry.lock", "conda environment": "a conda environment.yml",
               "environment": "an installed environment"}  # fmt: skip


def read_lines(report: Report) -> list[str]:
    """What was read, one line per file and per config: the releases a file installs on the target (and what it
    says of the rest), each config's setup in the vocabulary (as the page says it)."""
    lines = []
    for one in report.inputs:
        judged = [f"{p['name']} {p['version']}" for p in one["packages"] if p["judged"]]
        ranged = [f"{x} (a range)" for x in one["loose"] if re.split(r"[<>=!~;\[ ]", x, maxsplit=1)[0] in AXIS_PACKAGES]
        said = ", ".join(judged + ranged) or "none of the judged packages"
        missing = f"; not installed: {', '.join(one['not_installed'])}" if one["not_installed"] else ""
        notes = f" ({'; '.join(one['notes'])})" if one["notes"] else ""
        kind = INPUT_WORDS[one["kind"]] + (" naming a complete environment" if one["complete"] and one["kind"] ==
                                           "requirements" else "")  # fmt: skip
        where = f" for {report.target['words']}" if report.target else ""
        lines.append(f"read {one['file']} as {kind}{where}: {said}{missing}{notes}")
    lines += [config_line(c) for c in report.configs]
    return lines


def columns(report: Report) -> list[str]:
    lines = read_lines(report)
    for group in _grouped(report.answers):
        answer = group[0]
        if len(group) == 1:
            lines.append(f"{LABELS[answer['state']]:10} {answer['id']}  {_title(report, answer)}")
        else:  # several failures of one scenario undecided for one reason: said once
            lines.append(f"{LABELS[answer['state']]:10} {len(group)} failures of {_title(report, answer)}: "
                         + ", ".join(a["id"] for a in group))  # fmt: skip
        lines += [f"           {line}" for line in _answer_lines(report, answer)]
    if report.loose:
        lines.append(f"not pinned exactly (judged by the releases the atlas measured in their range): "
                     f"{', '.join(report.loose)}")  # fmt: skip
    lines += way_out_lines(report)
    lines.append(totals_line(report))
    return lines


def _grouped(answers: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The answers in order, undecided ones of one scenario, device and reason together."""
    groups: list[list[dict[str, Any]]] = []
    for answer in answers:
        last = groups[-1][0] if groups else None
        same = ("scenario", "device", "state", "why", "sure")
        if last is not None and answer["state"] == "undecided" and all(last[k] == answer[k] for k in same):
            groups[-1].append(answer)
        else:
            groups.append([answer])
    return groups


def _title(report: Report, answer: dict[str, Any]) -> str:
    if answer["state"] == "pitfall":
        where = "on GPUs" if answer["device"] == "cuda" else "on CPU"
        return f"{answer['scenario']}: a pitfall of {answer['when']} ({where})"
    return _summary(report.failure(answer["id"]))


def _answer_lines(report: Report, answer: dict[str, Any]) -> list[str]:
    state = answer["state"]
    if state == "pitfall":
        return [f"why: {answer['why']}", f"way out: {', '.join(answer.get('way_out') or [])}"]
    failure = report.failure(answer["id"])
    lines = [f"when: {answer.get('when') or 'any setup'}"]
    if state == "applies-if":
        lines.append(f"applies if: {failure['detail']}")
    lines.append(f"{'because' if state in ('undecided', 'cleared') else 'you have'}: {answer['why']}")
    if state != "cleared":
        lines.append(f"how sure: {SURE_WORDS.get(answer['sure'], answer['sure'])}")
    if state in ("undecided", "range"):
        lines.append(f"measure it: {measure_command(failure, report.query)}")
    if state in ("applies", "applies-if"):
        lines += [f"way out: {n}" for n in note_lines(report, answer["id"])]
        lines += fix_lines(report, answer["id"])
    return lines


#: What a fix is at the user's releases, setup and GPU count, in words.
FIX_STATE_WORDS = {"fixes": "fixes it here", "does-not-fix": "does not fix it here: it fails the same way",
                   "brings": "ends it here and brings", "unmeasured": "not measured here"}  # fmt: skip
FIX_SURE_WORDS = {"exact": "a record at these releases", "bracketed": "bracketed by the releases measured around yours"}
#: How many fixes an answer lists in the columns (every one is in --format json).
SHOWN_FIXES = 3


def fix_words(fix: dict[str, Any]) -> str:
    """'FSDP: FSDP2 instead of FSDP1: fixes it here (a record at these releases)'; an unmeasured one says where it
    was measured instead."""
    said = FIX_STATE_WORDS[fix["state"]] + (f" {', '.join(fix['brings'])}" if fix["state"] == "brings" else "")
    if fix["state"] == "unmeasured":
        return f"{fix['words']}: {said} ({fix['why']}; {fix['where'] or 'measured nowhere else'})"
    return f"{fix['words']}: {said} ({FIX_SURE_WORDS[fix['sure']]})"


def fix_lines(report: Report, failure_id: str, indent: str = "") -> list[str]:
    """Each fix of the failure judged at the user's releases, most sure first; the command that measures the ones not
    measured here."""
    fixes = report.fixes(failure_id)
    lines = [f"{indent}{f['kind']}: {fix_words(f)}" for f in fixes[:SHOWN_FIXES]]
    if len(fixes) > SHOWN_FIXES:
        lines.append(f"{indent}{len(fixes) - SHOWN_FIXES} more fixes judged in --format json")
    if any(f["state"] == "unmeasured" for f in fixes[:SHOWN_FIXES]):
        lines.append(f"{indent}measure the fixes here: {measure_command(report.failure(failure_id), report.query)}")
    return lines


SURE_WORDS = {
    "exact": "records at exactly these releases of every package it depends on, this setup",
    "bracketed": "not measured at these exact releases; the releases measured around them decide it",
    "unmeasured": "not measured here",
}


def note_lines(report: Report, failure_id: str) -> list[str]:
    """What one move of each of the failure's packages does: 'upgrade peft to 0.21.0: ends it; brings S7 ...'."""
    lines = []
    stays = failure_id in report.way_out.get("stays", [])
    for note in report.way_out.get("notes", {}).get(failure_id, []):
        if not note.get("release"):
            lines.append(note.get("why", "") + (": a fix of the setup below" if stays else ""))
            continue
        verb = "upgrade" if note["direction"] == "upgrade" else "pin"
        brings = [f"{i} ({report.failure(i)['scenario']})" for i in note["brings"] if i != failure_id]
        along = note.get("along") or {}
        needs = f" with {', '.join(f'{p} {v}' for p, v in along.items())} (what it declares it needs)" if along else ""
        lines.append(f"{verb} {note['package']} to {note['release']}{needs} (measured): ends it"
                     + (f"; brings {', '.join(brings)}" if brings else ""))  # fmt: skip
    if stays and not lines:
        lines.append("no measured release ends it: a fix of the setup below")
    return lines


def way_out_lines(report: Report) -> list[str]:
    """The one recommended set of pins: one line, or under `--fix` as a requirements diff (a unified diff of the user's
    requirements file where one was read) and the install lines."""
    found = report.way_out
    if not found.get("pins"):
        return [f"way out: {found['none']}"] if found.get("none") else []
    pins = found["pins"]
    if not report.fix:
        lines = ["recommended pins (each release measured; judged again over every known failure): "
                 + " ".join(f"{p}=={v}" for p, v in pins.items())
                 + " (--fix: as a diff and install lines; --fix --measure: proven by a run here)"]  # fmt: skip
    else:
        lines = ["recommended pins (each release measured; judged again over every known failure):"]
        lines += _diff(report, pins) or [
            *(f"  - {p}=={found['from'][p]}" if found["from"].get(p) else f"  - {p} (not pinned)" for p in pins),
            *(f"  + {p}=={v}" for p, v in pins.items()),
        ]
        lines += [f"  {line}" for line in install_lines(pins)]
    if found.get("still"):
        lines.append(f"  it leaves applying: {', '.join(found['still'])} ({found['none']})")
    if found.get("brings"):
        lines.append(f"  it brings (applies at these pins, not at yours): {', '.join(found['brings'])}"
                     + ("" if found.get("still") else f" ({found['none']})"))  # fmt: skip
    if found.get("leaves"):
        lines.append(f"  it leaves undecided (not measured there): {len(found['leaves'])} failure(s)")
    return lines


def install_lines(pins: dict[str, str]) -> tuple[str, str]:
    """The `uv add` and `pip install` lines that move to the pins."""
    quoted = " ".join(f"'{p}=={v}'" for p, v in pins.items())
    return f"uv add {quoted}", f"pip install {quoted}"


def moved_file(report: Report, pins: dict[str, str]) -> Moved | None:
    """The requirements file that names the moved packages (the first read where none does), moved to the pins with
    every other byte kept; None where no requirements file was read (a lockfile is changed by `uv add`)."""
    if not report.requirements:
        return None
    naming = [p for p in report.requirements if set(pins) & set(map(requirement_name, read_text(p).splitlines()))]
    return move((naming or report.requirements)[0], pins, report.markers or here().environment())


def _diff(report: Report, pins: dict[str, str]) -> list[str]:
    """The unified diff of the moved requirements file, and what could not be moved in place (empty where no
    requirements file was read)."""
    moved = moved_file(report, pins)
    if moved is None:
        return []
    lines = [f"  {line}" for line in moved.diff()]
    if moved.mark[:2] in (b"\xff\xfe", b"\xfe\xff"):
        lines.append(f"  {moved.path} is UTF-16: this diff is of its text; --fix --write writes the file itself")
    return lines + [f"  note: {note}" for note in moved.notes]


def markdown(report: Report) -> str:
    said = [f"- {line}" for line in read_lines(report)]
    lines = [*said, *([""] if said else []), "| advisory | state | what | setups | how sure | way out |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for answer in report.answers:
        link = (
            f"[{answer['id']}](results/advisories/{answer['id']}.json)"
            if answer["state"] != "pitfall"
            else answer["id"]
        )
        way = (
            "; ".join(note_lines(report, answer["id"]))
            if answer["state"] != "pitfall"
            else ", ".join(answer.get("way_out") or [])
        )
        lines.append(f"| {link} | {LABELS[answer['state']]} | {_title(report, answer)} | {answer.get('when') or ''} | "
                     f"{answer['sure'] or '-'} | {way or answer['why']} |")  # fmt: skip
    lines += ["", *[line.lstrip() for line in way_out_lines(report)], "", f"**{totals_line(report)}**"]
    return "\n".join(lines)


def measure_argv(failure: dict[str, Any], query: Query) -> list[str]:
    """The command that measures the user's own releases for this failure, as an argv: `lookup --measure` here on
    CPU; on a GPU node, `check` inside the user's environment (where: `measure_place`)."""
    if failure["device"] == "cuda" or query.device == "cuda":
        return ["compat-matrix", "check", "--scenario", failure["scenario"]]
    asked = [f"{p}=={query.versions[p]}" for p in failure["depends"] if p in query.versions]
    setup = ",".join(v for k, v in query.setup.items() if k in ("engine", "adapter", "loop", "state_dict"))
    said = ["--setup", setup] if setup else []
    return ["compat-matrix", "lookup", *asked, "--scenario", failure["scenario"], *said, "--measure"]


def measure_place(failure: dict[str, Any], query: Query) -> dict[str, Any]:
    """Where `measure_argv` runs: here (CPU), or in the audited environment on a node with N GPUs."""
    if failure["device"] == "cuda" or query.device == "cuda":
        return {"where": "the audited environment, on a GPU node", "device": "cuda",
                "gpus": query.gpus or max(failure["world_sizes"] or [1])}  # fmt: skip
    return {"where": "here", "device": "cpu", "gpus": 0}


def measure_command(failure: dict[str, Any], query: Query) -> str:
    """`measure_argv` in words, as the columns print it."""
    argv = " ".join(shlex.quote(a) for a in measure_argv(failure, query))
    place = measure_place(failure, query)
    if place["device"] == "cuda":
        return f"in that environment on {place['gpus']} GPU(s): `{argv}`"
    return f"`{argv}`"


def command(args: Any) -> Report:
    """Read the user's files, judge, print the answer; the report (its `gate` is the exit code)."""
    if sum(bool(x) for x in (args.files, args.env, args.python)) != 1:
        raise UsageError("give one of: lockfiles or requirements files, --env, or --python PATH")
    if args.gpus is not None and args.gpus < 0:
        raise UsageError(f"--gpus {args.gpus}: give 0 (a CPU run) or how many GPUs you train on")
    if args.measure and not args.fix:
        raise UsageError("--measure proves the way out --fix prints: give --fix --measure")
    if getattr(args, "write", False) and not args.fix:
        raise UsageError("--write writes the way out --fix prints: give --fix --write")
    target = target_of(getattr(args, "platform", None), getattr(args, "python_version", None))
    if args.files:
        found = read_all([Path(p) for p in args.files], target)
        inputs = [f.as_json() for f in found.files]
    else:
        found = Pins(pins=environment_pins(args.python))
        inputs = [_environment_input(args.python, found.pins)]
    user = read_setup(args.accelerate_config, args.deepspeed_config, args.setup or [], args.trainer_config, found.pins)
    gpus = args.gpus if args.gpus is not None else user.gpus
    tables = load_tables(args.results_dir)
    query = query_of(
        tables, found.pins, user.setup, found.loose, found.partial, gpus, args.device, args.ignore_id or []
    )
    report = audit(tables, query)
    report.loose, report.requirements, report.fix = found.loose + found.unnamed, found.requirements, args.fix
    report.inputs, report.configs = inputs, _configs(user)
    report.target = target.as_json() | {"words": target.words()} if args.files else {}
    report.markers = target.environment()
    print(render(report, args.format))
    if getattr(args, "write", False):
        print(write_fix(report), file=sys.stderr)
    return report


def write_fix(report: Report) -> str:
    """`--fix --write`: the requirements file rewritten to the way out's pins, in its own encoding and line ends."""
    pins = report.way_out.get("pins") or {}
    moved = moved_file(report, pins) if pins else None
    if moved is None:
        return "--write: nothing written (" + ("no way out to write" if not pins else "no requirements file read: "
                                             "a lockfile is changed by `uv add`") + ")"  # fmt: skip
    moved.write()
    return f"--write: wrote {moved.path} ({len(pins)} pin(s) moved" + (f"; {len(moved.notes)} note(s) above)"
                                                                       if moved.notes else ")")  # fmt: skip


def _environment_input(python: str | None, pins: dict[str, str]) -> dict[str, Any]:
    return {"file": python or "this environment", "kind": "environment", "complete": True,
            "packages": [{"name": p, "version": v, "judged": p in AXIS_PACKAGES} for p, v in sorted(pins.items())
                         if p in AXIS_PACKAGES],
            "loose": [], "not_judged": [], "notes": [],
            "not_installed": sorted(p for p in AXIS_PACKAGES if p not in pins)}  # fmt: skip


def _configs(user: UserSetup) -> list[dict[str, Any]]:
    return [c | {"line": config_line(c)} for c in user.configs]
