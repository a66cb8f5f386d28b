"""`compat-matrix audit --fix --measure`: the recommended way out proven by a run, not only advised.

pip-audit's `--fix` and Dependabot upgrade without running anything. Here the stack the way out names (the user's
pins with the recommended moves) is built on CPU over the nearest atlas day (`measure.py`, as `lookup
--measure` does), the seed configs of every scenario whose failure applied run with their fixes, and the run is
recorded under `results/measured/`. The judge then answers again from the tables with that run in them: each failure
that applied is "measured clean at these exact releases", still failing, or undecided, and says so. A failure that
shows only on GPUs cannot run here: it gets the command that measures it on a GPU node.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES
from harness.knowledge.judge import evaluate
from harness.knowledge.ways_out import BLOCKING, ENDED
from harness.tools.answers.audit import Report

#: What each answer after the run is called.
AFTER_WORDS = {
    "clean": "measured clean",
    "not-applicable": "no longer concerns this setup",
    "cleared": "cleared by the setup's fix",
    "undecided": "UNDECIDED",
    "applies": "STILL APPLIES",
    "applies-if": "STILL APPLIES IF its condition holds",
    "range": "RANGE",
}


def target_pins(report: Report) -> dict[str, str]:
    """The releases after the fix: every axis package the user pinned, with the recommended moves."""
    pinned = {p: v for p, v in report.query.versions.items() if p in AXIS_PACKAGES}
    return pinned | dict(report.way_out.get("pins") or {})


def applying(report: Report) -> list[dict[str, Any]]:
    return [a for a in report.answers if a["state"] in BLOCKING]


#: How many stacks one `--measure` builds: a way out measured not to run is left out by the judge from then on and the
#: next one is built in its place; a way out whose runs failed through a pair of the stack whose APIs do not meet is
#: built again with the nearest release that may meet it.
MOST_ATTEMPTS = 3


def prove(report: Report, results_dir: Path, say: Any = print, strict: bool = False) -> tuple[list[str], int]:
    """Measure the way out here (unless a record already holds it) and judge every failure that applied again.
    Returns the lines to print and the exit code: 0 when every failure that applied is measured clean at exactly
    these releases (or ended by the setup), 1 otherwise. A failure that applies only if the user's model has a
    condition (applies if) is reported apart and does not block the proof, unless `strict`."""
    from harness.define.registry import discover
    from harness.tools.answers.audit import audit

    applied = applying(report)
    before = [a for a in applied if strict or a["state"] == "applies"]
    conditional = [a for a in applied if a not in before]
    if not before:
        if conditional:
            return [f"nothing applies unless your model has a condition no lockfile shows ({len(conditional)} "
                    "APPLIES IF): nothing to prove (--strict proves those too)"], 0  # fmt: skip
        return ["nothing applies: no way out to measure"], 0
    specs = {s.id: s.spec for s in discover()}
    here = sorted({a["scenario"] for a in before if a["device"] == "cpu"})
    lines: list[str] = []
    pins: dict[str, str] | None = None
    for attempt in range(1, MOST_ATTEMPTS + 1):
        if pins is None:
            if not report.way_out.get("pins"):
                return [*lines, f"not proven: no way out to build ({report.way_out.get('none') or 'none found'})"], 1
            pins = target_pins(report)
        lines.append(f"the way out measured ({attempt} of at most {MOST_ATTEMPTS}): "
                     + ", ".join(f"{p}=={v}" for p, v in sorted(pins.items())))  # fmt: skip
        atlas, why = _measured(results_dir, specs, report, pins, here, lines, say)
        if why is None:
            refused = refused_pairs(atlas, pins, here)
            if not refused:
                break
            lines += [f"  its runs fail through a pair whose APIs do not meet: {_pair_words(b)}" for b in refused]
            around = way_round(atlas.tables, pins, refused[0])
            if around is None or attempt == MOST_ATTEMPTS:
                lines.append("  no measured release of either is known to meet the other: not measured further"
                             if around is None else "  no attempt left to measure a way round")  # fmt: skip
                break
            lines.append("  a way round, measured next: " + ", ".join(f"{p}=={v}" for p, v in around.items()))
            pins = pins | around
            continue
        lines.append(f"  it does not run here ({why}): the judge leaves it out from now on")
        if why.startswith("does not install"):
            return [*lines, "not proven: the recommended releases do not install together"], 1
        report = audit(atlas.tables, report.query)
        report.fix = True
        pins = None
    else:
        return [*lines, f"not proven: none of {MOST_ATTEMPTS} ways out ran here"], 1
    after = {a["id"]: a for a in evaluate(atlas.tables, replace(report.query, versions=pins, ranges={}))}
    other = _other_failures(atlas, pins)
    proven = True
    for answer in before:
        now = after.get(answer["id"]) or _same_failure(after, answer)
        lines.append(_after_line(answer, now, report))
        if now is not None and now["state"] == "undecided" and answer["scenario"] in other:
            lines.append(f"           its records there fail with: {other[answer['scenario']]}")
        proven &= now is not None and now["state"] in ENDED and (now["state"] != "clean" or now["sure"] == "exact")
    for answer in conditional:
        now = after.get(answer["id"]) or _same_failure(after, answer)
        lines.append("(if your model has it) " + _after_line(answer, now, report))
    earlier = {b["id"] for b in applied}
    brought = [a for i, a in after.items() if a["state"] in BLOCKING and i not in earlier]
    for answer in brought:
        label = "BROUGHT" if strict or answer["state"] == "applies" else "BROUGHT IF"
        lines.append(f"{label:10} {answer['id']} ({answer['scenario']}): {answer['why']}")
    proven &= not [a for a in brought if strict or a["state"] == "applies"]
    if conditional:
        lines.append(f"{len(conditional)} failure(s) apply only if your model has their condition: reported above, "
                     "not part of the proof (--strict makes them part)")  # fmt: skip
    lines.append(
        "every failure that applied is measured clean at these exact releases or ended by the setup"
        if proven
        else "not proven: the lines above say which failure is not measured clean at these exact releases"
    )
    moved = {p: v for p, v in pins.items() if report.query.versions.get(p) != v}
    if moved:
        from harness.tools.answers.audit import install_lines

        lines.append("the releases measured, to move to: " + " ".join(f"{p}=={v}" for p, v in sorted(moved.items()))
                     + f" ({install_lines(dict(sorted(moved.items())))[1]})")  # fmt: skip
    return lines, 0 if proven else 1


def refused_pairs(atlas: Any, pins: dict[str, str], scenarios: list[str]) -> list[dict[str, Any]]:
    """The pairs of these releases whose APIs the records at exactly them showed not meeting (a call one package made
    that another refused), among the scenarios run: what kept the run from deciding a failure either way."""
    stack = {p: v for p, v in pins.items()}
    found = []
    for broken in atlas.tables.get("broken", []):
        if broken.get("caller") and all(stack.get(p) == v for p, v in broken["versions"].items()):
            found.append(broken)
    return found


def _pair_words(broken: dict[str, Any]) -> str:
    caller, callee = broken["caller"], broken["callee"]
    return (f"{caller} {broken['versions'][caller]} calls {callee} {broken['versions'][callee]}, which refuses it "
            f"({broken['why']})")  # fmt: skip


def way_round(tables: dict[str, Any], pins: dict[str, str], broken: dict[str, Any]) -> dict[str, str] | None:
    """The nearest newer measured release of the refusing package (the API the caller wants came later), else of the
    caller the nearest older one, that the records do not show refusing, with what it declares it needs: a stack to
    measure next, never a claim that it meets."""
    from harness.knowledge.broken import measured_broken
    from harness.knowledge.installable import complete
    from harness.knowledge.judge import key

    for package, newer in ((broken["callee"], True), (broken["caller"], False)):
        have = key(pins[package])
        releases = [v for v in tables["releases"].get(package, []) if (key(v) > have) == newer and key(v) != have]
        for release in sorted(releases, key=key, reverse=not newer):
            moved = complete(tables, pins, {package: release})
            if moved is not None and not measured_broken(tables, pins, moved):
                return moved
    return None


def _measured(
    results_dir: Path, specs: dict[str, Any], report: Report, pins: dict[str, str], here: list[str],
    lines: list[str], say: Any,
) -> tuple[Any, str | None]:  # fmt: skip
    """(the atlas with the run of these pins in it, why the stack did not run or None): the scenarios no record at
    exactly these releases holds are run here."""
    from harness.knowledge.atlas import Atlas
    from harness.tools.answers.lookup import observed_at
    from harness.tools.answers.measure import could_not_install, did_not_run, measure

    atlas = Atlas(results_dir, specs)
    asked = replace(report.query, versions=pins, ranges={}, device="cpu", gpus=0)
    missing = [s for s in here if not observed_at(atlas, s, asked)]
    if not missing:
        if here:
            lines.append("  already recorded at these releases: " + ", ".join(here))
        return atlas, None
    run_dir = measure(results_dir, atlas.days("cpu"), pins, missing, say)
    lines.append(f"  recorded: {run_dir}")
    failed = could_not_install(run_dir)
    why = f"does not install: {failed}" if failed else did_not_run(run_dir)
    return Atlas(results_dir, specs), (f"does not import: {why}" if why and not failed else why)


def _other_failures(atlas: Any, pins: dict[str, str]) -> dict[str, str]:
    """scenario -> the error its records at exactly these releases fail with most, where it is not a failure the
    scenario knows (unclassified): what kept the run from deciding a failure either way."""
    from collections import Counter

    found: dict[str, Counter[str]] = {}
    for record in atlas.probes:
        versions = record.get("versions") or {}
        if all(versions.get(p) == v for p, v in pins.items()) and str(record.get("signature")).startswith(
            "unclassified"
        ):
            message = str(record.get("message") or "").strip().splitlines()
            found.setdefault(record["scenario"], Counter())[message[-1] if message else record["signature"]] += 1
    return {s: c.most_common(1)[0][0] for s, c in found.items()}


def _same_failure(after: dict[str, dict[str, Any]], answer: dict[str, Any]) -> dict[str, Any] | None:
    """A failure whose id changed with the new records (its configs regrouped): its scenario's and device's answer
    that is worst, else None."""
    mine = [a for a in after.values() if a["scenario"] == answer["scenario"] and a["device"] == answer["device"]]
    order = ("applies", "applies-if", "range", "undecided", "cleared", "clean", "not-applicable")
    mine = [a for a in mine if a["state"] in order]
    return min(mine, key=lambda a: order.index(a["state"])) if mine else None


def _after_line(before: dict[str, Any], now: dict[str, Any] | None, report: Report) -> str:
    failure = report.failure(before["id"])
    head = f"{before['id']} ({failure['scenario']}, {'GPUs' if failure['device'] == 'cuda' else 'CPU'})"
    if failure["device"] == "cuda" and (now is None or now["sure"] != "exact"):
        from harness.tools.answers.audit import install_lines

        gpus = report.query.gpus or max(failure.get("world_sizes") or [1])
        return (f"ON A GPU NODE {head}: not measurable here; on {gpus} GPU(s), in your environment: "
                f"`{install_lines(report.way_out.get('pins') or {})[1]} && compat-matrix check --scenario "
                f"{failure['scenario']}`")  # fmt: skip
    if now is None:
        return f"UNDECIDED  {head}: the judge holds no answer for it after the run"
    words = AFTER_WORDS.get(now["state"], now["state"])
    if now["state"] == "clean":
        words += " at these exact releases" if now["sure"] == "exact" else f" ({now['sure']}, not at these releases)"
    return f"{words:10} {head}: {now['why']}"
