"""The atlas view of dated (history) runs: a timeline per scenario (dates with the stack of each, against the
target outcome, fixes marked, flips labelled) and the "what changed it" list from `compat-matrix flips`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.define.packages import AXIS_PACKAGES, public_version, short_name
from harness.define.profile import DATE_AXIS
from harness.knowledge.flips import CONFIG_SERIES, dated_verdicts, family_state
from harness.recording.flip import Flip
from harness.recording.verdicts import variant_kinds
from harness.textsafe import code, md

#: Colour per verdict state on the timeline.
COLOURS = {
    "target": "#d62728",
    "not-reproduced": "#2ca02c",
    "failures": "#ff7f0e",
    "passes": "#2ca02c",
    "skip": "#c7c7c7",
    "env-broken": "#7f7f7f",
    "install-failed": "#7f7f7f",
}


def atlas_words(atlas: str) -> str:
    """'on CPU', 'on one GPU', 'on 2 GPUs (world size 2)'."""
    if atlas == "cpu":
        return "on CPU"
    if atlas == "cuda":
        return "on one GPU"
    count = atlas.rsplit("ws", 1)[-1]
    return f"on {count} GPUs (world size {count})"


def held_torch(records: list[dict[str, Any]]) -> str | None:
    """'2.11.0+cu130' when every record ran one torch taken from the node (pin 'system'), else None."""
    if not records or any((r.get("pins") or {}).get("torch") != "system" for r in records):
        return None
    torches = {str((r.get("versions") or {}).get("torch")) for r in records}
    runtimes = {str((r.get("versions") or {}).get("nvidia-cuda-runtime", "")) for r in records}
    if len(torches) != 1 or len(runtimes) != 1:
        return None
    torch, runtime = torches.pop(), runtimes.pop()
    build = "+cu" + "".join(runtime.split(".")[:2]) if runtime and "+" not in torch else ""
    return torch + build


def plot_timeline(
    records: list[dict[str, Any]],
    specs: dict[str, dict[str, Any]],
    flips: list[Flip],
    path: Path,
    device: str = "cpu",
) -> Path | None:
    """One row per scenario, one column per date (its stack under it): the target outcome, the number of
    configs it shows on, the fixes that remove it (F) or only a workaround (W), and each named flip."""
    dates, stacks, verdicts = dated_verdicts(records, specs)
    if not dates:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted(verdicts, key=lambda s: int(s[1:].split("-")[0]))
    fig, ax = plt.subplots(figsize=(max(8, 1.15 * len(dates)), 1.0 + 0.62 * len(scenarios)))
    for row, scenario in enumerate(scenarios):
        kinds = variant_kinds(specs.get(scenario))
        for col, date in enumerate(dates):
            found = verdicts[scenario].get(date)
            state = found.state if found else "empty"
            colour = COLOURS["failures"] if state == "not-reproduced" and found.others else COLOURS.get(state, "white")
            ax.add_patch(plt.Rectangle((col, row), 0.96, 0.9, color=colour, ec="#999999"))
            label = _cell_label(found, kinds)
            ax.text(col + 0.48, row + 0.45, label, ha="center", va="center", fontsize=7, color="white")
    for flip in flips:
        if flip.scenario not in scenarios or flip.newer not in dates:
            continue
        states = _states_today(flip, verdicts)
        if states is not None and states[0] == states[1]:
            continue  # not a flip under today's rules (see flips_markdown)
        row, col = scenarios.index(flip.scenario), dates.index(flip.newer)
        by = f"{flip.package} {flip.release or '?'}" if flip.package else "?"
        if flip.masked_by:
            by = "masked"  # another failure, or configs not applicable here, hide the target: no cause to name
        ax.plot([col - 0.02, col - 0.02], [row - 0.05, row + 0.95], color="black", linewidth=2)
        box = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "black", "linewidth": 0.6}
        ax.text(col - 0.02, row + 0.45, by, fontsize=6.5, ha="center", va="center", bbox=box)
    ax.set_xlim(0, len(dates))
    ax.set_ylim(len(scenarios) + 0.2, -0.1)
    names = [s.split("-")[0] + " " + s.split("-", 1)[1][:22] for s in scenarios]
    ax.set_yticks([i + 0.45 for i in range(len(scenarios))], names, fontsize=8)
    stack_labels = [_stack_label(d, stacks.get(d, {})) for d in dates]
    ax.set_xticks([i + 0.48 for i in range(len(dates))], stack_labels, fontsize=6.5)
    ax.xaxis.tick_top()
    fixed = held_torch(records)
    where = atlas_words(device) + (f", torch fixed at {fixed}" if fixed else "")
    ax.set_title(
        f"Target outcome per install date, {where} (the stack installed that day above each column).\n"
        "Red: the target failure on k/n seed configs (F: a fix removes it, W: only a workaround). "
        "Orange: not the target, other failures.\nGreen: neither. Grey: not runnable here (env: environment "
        "broken). A labelled bar: a named flip (package, first release); 'masked': the target is hidden there.",
        fontsize=8,
        pad=62,
    )
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _cell_label(found: Any, kinds: dict[str, str]) -> str:
    if found is None:
        return ""
    if found.state in ("target", "failures"):
        fixes = [n for n in found.fixed if kinds.get(n) == "fix"]
        mark = "F" if fixes else ("W" if found.fixed else "")
        return f"{len(found.target_records)}/{found.candidates} {mark}".strip()
    if found.state in ("not-reproduced", "passes"):
        return f"0/{found.candidates}" + (" +other" if found.others else "")
    return {"skip": "skip", "env-broken": "env", "install-failed": "inst"}.get(found.state, found.state[:5])


def _stack_label(date: str, versions: dict[str, Any]) -> str:
    parts = [date] + [f"{short_name(p)} {public_version(str(versions[p]))}" for p in AXIS_PACKAGES if versions.get(p)]
    return "\n".join(parts)


def upstream_verdict(flip: Flip, configs: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The upstream record of the flip's failure in the flip's direction (of the feature its `configs` hold, where a
    record is about one), and whether the measured package and release agree with it (recomputed whenever the table
    is made, from scenarios/failure_names.py)."""
    from scenarios.failure_names import upstream_change

    known = upstream_change(flip.signature, flip.newer_state, (flip.package, flip.release), configs)
    if known is None:
        return None
    if not flip.package:
        return known | {"agrees": None}  # nothing measured to compare: neither agrees nor differs
    if not flip.release:  # the package is named, its release not yet: another package already differs
        return known | {"agrees": None if flip.package == known["package"] else False}
    return known | {"agrees": (flip.package, flip.release) == (known["package"], known["release"])}


def flips_markdown(
    flips: list[Flip],
    records: list[dict[str, Any]] | None = None,
    specs: dict[str, dict[str, Any]] | None = None,
    where: str = "the history run",
) -> str:
    """The "what changed it" list: one line per flip, with the probes and whether upstream agrees."""
    if not flips:
        return ""
    lines = [
        "",
        f"## What changed it (flips of {where})",
        "",
        "Between neighbouring install dates where a scenario's target outcome changes, each changed package was "
        "moved alone (the rest held at the older date's releases) in a real one-cell run, then the one that "
        "reproduces the change was bisected. A probe is evidence only where the configs that showed the failure "
        "ran and passed or showed it; a timeout, another failure or a stack that could not install is no evidence "
        "and names nothing (`compat-matrix flips`; probes' records under `results/flips/`"
        + (
            "; on a GPU node in rounds of probe days, `harness/tools/gpu_node/node_flips.py`)."
            if "GPU" in where
            else ")."
        ),
        "",
        "| scenario | failure | change | dates | package | first release | upstream record |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = dated_verdicts(records, specs or {})[2] if records else {}
    set_aside: list[str] = []
    quiet: list[str] = []
    for flip in flips:
        if flip.older_state == flip.newer_state:
            # A window: two days that agree, swept over the releases between them (a fix and the break after it).
            if flip.changes:
                lines.append(_window_line(flip, configs_of(flip, records or [])))
            elif flip.sweep:
                quiet.append(f"{md(flip.scenario)}{_series(flip)} {md(flip.older)} .. {md(flip.newer)}"
                             f"{_node_cost_words(flip)}")  # fmt: skip
            continue
        configs = configs_of(flip, records or [])
        upstream = upstream_verdict(flip, configs)
        agrees = ""
        if upstream:
            verdict_ = {True: "agrees", False: "differs"}.get(upstream.get("agrees"), "not compared: none named here")
            agrees = f"{md(upstream['package'])} {md(upstream['release'])}: {verdict_}"
        change = f"{md(flip.older_state)} -> {md(flip.newer_state)}"
        states = _states_today(flip, verdicts)
        if states is not None and states[0] == states[1]:
            # Judged again with today's rules the two dates agree: the stored flip was made by records that are
            # no evidence (not applicable here), so it names no cause.
            set_aside.append(
                f"- {md(flip.scenario)} {md(flip.older)} .. {md(flip.newer)}: was {change} "
                f"({md(flip.package or '?')} {md(flip.release or '')}); both dates are "
                f"{md(states[0])} under today's rules"
            )
            continue
        # A package only where one move alone reproduced the change; else "not named" and what each move showed
        # (a timeout or another failure is no evidence either way).
        package = md(flip.package) if flip.package else md(f"not named: {flip.why_not_named()}")
        release = md(flip.release_words()) if flip.package else "-"
        others = flip.masked_by  # decided once, by the atlas (`knowledge.flips.with_masking`)
        if others:
            # A target hidden by another failure is not caused by a release: the cause columns stay empty.
            change += " (masked by " + ", ".join(code(o) for o in others) + ")"
            package, release = "- (masking, not a cause)", "-"
            if upstream and flip.newer_state != "target":
                agrees = f"{md(upstream['package'])} {md(upstream['release'])}: not comparable (masked, not fixed)"
        if flip.changes and not others:
            # A sweep: every change between the two days, each compared with the upstream record of its direction.
            release = md(flip.changes_words()) + _node_cost_words(flip)
            agrees = "; ".join(_change_upstream_words(flip, c, configs) for c in flip.changes)
        lines.append(
            f"| {md(flip.scenario)}{_series(flip)} | {code(flip.signature or '-')} | "
            f"{change} | {md(flip.older)} .. {md(flip.newer)} | {package} | {release} | {agrees} |"
        )
    if quiet:
        lines += [
            "",
            "Day pairs whose outcome agrees, swept over the releases the upstream record names between them, with no "
            "change found inside (`compat-matrix flips --run RUN --windows`): " + "; ".join(quiet) + ".",
        ]
    if set_aside:
        lines += [
            "",
            "Flips measured earlier that today's rules no longer see (the records that made them are not "
            "applicable here):",
            "",
            *set_aside,
        ]
    return "\n".join(lines) + "\n"


def configs_of(flip: Flip, records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The configs of a flip's series as its records ran them (what an upstream record about a feature is matched
    with); None where none is known."""
    wanted = set(flip.config_ids)
    if (flip.family or "").startswith(CONFIG_SERIES):
        wanted.add(str(flip.family)[len(CONFIG_SERIES) :])
    found = {r["config_id"]: r.get("config") or {} for r in records
             if r["scenario"] == flip.scenario and r["config_id"] in wanted}  # fmt: skip
    return list(found.values()) or None


def _series(flip: Flip) -> str:
    """' (config-6827e2abe2)' for one config's series, '' for a scenario's."""
    return f" ({md(flip.family)})" if (flip.family or "").startswith(CONFIG_SERIES) else ""


def change_upstream(
    flip: Flip, change: dict[str, Any], configs: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The upstream record of one change a sweep found (its own direction), and whether it names this release."""
    from scenarios.failure_names import upstream_change

    newer_state = "target" if change["direction"] == "started" else "not-reproduced"
    known = upstream_change(flip.signature, newer_state, (change["package"], change["release"]), configs)
    if known is None:
        return None
    same = (change["package"], change["release"]) == (known["package"], known["release"])
    # A release the record names that was yanked (no run can install it) lies between the sweep's last release
    # before the change and the change: the change's release is the first installable one after it.
    yanked = known["release"] in ((flip.sweep or {}).get("yanked") or []) and known["package"] == change["package"]
    between = yanked and _release(change.get("last_before")) < _release(known["release"]) < _release(change["release"])
    return known | {"agrees": same or between, "yanked": between}


def _release(version: str | None) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version or "0").release
    except InvalidVersion:
        return (0,)


def _change_upstream_words(flip: Flip, change: dict[str, Any], configs: list[dict[str, Any]] | None = None) -> str:
    known = change_upstream(flip, change, configs)
    if known is None:
        return f"{md(change['release'])}: no upstream record"
    if known.get("yanked"):
        return (
            f"{md(change['release'])}: agrees ({md(known['release'])} is yanked; {md(change['release'])} is the next)"
        )
    return f"{md(change['release'])}: " + ("agrees" if known["agrees"] else f"differs ({md(known['release'])})")


def _node_cost_words(flip: Flip) -> str:
    """' (node: 12 probe days, 36 records, 41 s of jobs)' for a flip a GPU node named; '' otherwise."""
    cost = flip.node_cost
    if not cost:
        return ""
    return f" (node: {cost['probe_days']} probe days, {cost['records']} records, {cost['job_seconds']:g} s of jobs)"


def _window_line(flip: Flip, configs: list[dict[str, Any]] | None = None) -> str:
    """A window's row: both days agree, the sweep names every change between them and the runs behind each."""
    state = md(flip.older_state)
    agrees = "; ".join(_change_upstream_words(flip, c, configs) for c in flip.changes)
    note = f" ({md(flip.note)})" if flip.note else ""
    return (
        f"| {md(flip.scenario)}{_series(flip)} | {code(flip.signature or '-')} | {state} on both days, a window "
        f"inside | {md(flip.older)} .. {md(flip.newer)} | {md(flip.package or '-')} | {md(flip.changes_words())}"
        f"{note} | {agrees} |"
    )


def _states_today(flip: Flip, verdicts: dict[str, Any]) -> tuple[str, str] | None:
    """The target state of the flip's two dates under today's rules (None where a date has no records); of its
    failure family where the flip is of one (`family_state`)."""
    by_date = verdicts.get(flip.scenario, {})
    older, newer = by_date.get(flip.older), by_date.get(flip.newer)
    if older is None or newer is None:
        return None
    family = flip.family
    if family:
        shows = set(flip.config_ids or [])
        return family_state(older, family, shows)[0], family_state(newer, family, shows)[0]
    return _state(older), _state(newer)


def _state(found: Any) -> str:
    return "target" if found.state in ("target", "failures") else found.state


def plot_s5_history(records: list[dict[str, Any]], path: Path) -> Path | None:
    """S5's DoRA/LoRA peak-memory ratio per install date (the peft release under each), one line per seed
    config (its base as it really ran, autocast or not), baseline only; a cross marks the target failing."""
    points: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
    peft_at: dict[str, str] = {}
    for r in records:
        date = (r.get("pins") or {}).get(DATE_AXIS)
        ratio = (r.get("metrics") or {}).get("dora_lora_peak_ratio")
        if not date or not r["scenario"].startswith("S5-") or r["variant"] != "baseline" or ratio is None:
            continue
        config = r.get("config") or {}
        line = f"{r.get('path') or config.get('base')}{', autocast' if config.get('autocast') else ''}"
        points[line].append((date, float(ratio), r["outcome"] != "pass"))
        peft_at.setdefault(date, str((r.get("versions") or {}).get("peft", "?")))
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dates = sorted(peft_at)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(dates) + 3), 4.2))
    for line, values in sorted(points.items()):
        values.sort()
        xs = [dates.index(d) for d, _, _ in values]
        ax.plot(xs, [v for _, v, _ in values], marker="o", label=line)
        for x, (_, v, failed) in zip(xs, values, strict=True):
            if failed:
                ax.plot([x], [v], marker="x", color="black", markersize=9)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(dates)), [f"{d}\npeft {peft_at[d]}" for d in dates], fontsize=7)
    ax.set_ylabel("DoRA / LoRA peak memory")
    ax.set_title(
        "S5 on CPU per install date: DoRA's peak memory over LoRA's (x: the fp32-leak check failed)", fontsize=9
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
