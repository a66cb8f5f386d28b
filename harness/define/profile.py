"""Matrix profiles as data: load `matrix/<name>.toml`, validate every key, return a typed Profile.

Validation is strict on purpose: a typo in a profile would otherwise silently run a different matrix
than the one the user asked for, and a published table would then answer the wrong question.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.define import packages
from harness.define.packages import AXIS_PACKAGES, SUPPORT_PACKAGES
from harness.errors import ProfileError
from harness.recording.outcomes import RETRYABLE as RETRY_OUTCOMES

LATEST = "latest"
#: An axis given as a rule (resolved against the index when a run starts) is stored as this prefix + the rule.
RULE_PREFIX = "rule:"
ABSENT = "none"
#: "whatever the node's own python has": only with `[install] mode = "system"` (a preinstalled GPU stack).
SYSTEM = "system"
INSTALL_MODES = ("uv", "system")
DEVICES = ("cpu", "cuda", "auto")

PROFILE_KEYS = {"profile", "axes", "stacks", "implied", "exclude", "timeouts", "install", "scenario", "retry", "limits"}
RETRY_KEYS = {"times", "outcomes", "scope"}
RETRY_SCOPES = ("first-per-signature", "every-failure")
LIMIT_KEYS = {"worker_memory_mb"}
PROFILE_SECTION_KEYS = {
    "description",
    "python",
    "device",
    "world_size",
    "scenarios",
    "examples_per_scenario",
    "hypothesis_seed",
    "hypothesis_profile",
    "reduce",
    "example_variants",
    "failure_memory",
}
TIMEOUT_KEYS = {"install_s", "job_s", "worker_start_s"}
INSTALL_KEYS = {
    "no_build_isolation",
    "build_requires",
    "extra",
    "env",
    "mode",
    "overlay_support",
    "outside_era",
    "era_packages",
    "node_image",
    "optional",
}
#: The axis of install dates: each value is a day, and a cell gets every package as the index had it then.
DATE_AXIS = "date"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: A probe day of an era-locked profile: the day's stack with one axis package moved ('2025-11-14+transformers-5.0.0'),
#: its overlay in the profile's era lock (harness/tools/gpu_node/node_flips.py names GPU flips with these).
PROBE_DAY = re.compile(r"^(?P<day>\d{4}-\d{2}-\d{2})\+(?P<package>[a-z]+)-(?P<version>\d[\w.]*)$")
SCENARIO_KEYS = {"examples", "seed_examples", "job_timeout_s", "variants", "configs", "cells", "single_rank"}


@dataclass(frozen=True)
class Implied:
    """Pins that follow from another pin (transformers < 4.45 needs tokenizers 0.19.x, ...)."""

    when: dict[str, SpecifierSet]
    pins: dict[str, str]


@dataclass(frozen=True)
class Exclusion:
    """A cell pattern that is never built, with the reason it shows in the table."""

    when: dict[str, str]
    reason: str


@dataclass(frozen=True)
class ScenarioSettings:
    """Per-scenario overrides from `[scenario."<id>"]`."""

    examples: int | None = None
    #: Only the first N of the scenario's own seed examples (a mini matrix that needs one of them, not all).
    seed_examples: int | None = None
    job_timeout_s: float | None = None
    variants: tuple[str, ...] | None = None
    configs: tuple[dict[str, Any], ...] = ()
    #: Globs over cell ids; the scenario runs only there (elsewhere: skip, "not selected by the profile").
    cells: tuple[str, ...] | None = None
    #: A distributed scenario may run at world size 1 (one rank, under torchrun and a process group, FSDP or
    #: ZeRO over one GPU), to find out whether its target shows there; otherwise world size 1 is a skip.
    single_rank: bool = False


@dataclass(frozen=True)
class RetryPolicy:
    """Re-run failed jobs to tell a real failure from a random one (a disagreement is recorded as flaky).

    `first-per-signature` confirms the first failure of each signature per cell x scenario: a scenario
    that fails at random usually fails with a signature of its own, and confirming every repeat of a
    known, deterministic failure would double the cost of a matrix that is mostly failures.
    """

    times: int = 1
    outcomes: tuple[str, ...] = RETRY_OUTCOMES
    scope: str = "first-per-signature"


@dataclass(frozen=True)
class Profile:
    """A validated matrix profile."""

    name: str
    path: Path
    description: str
    python: str
    device: str
    #: The world-size axis: cells are expanded over it (an int each, or "all-gpus": whatever the node has).
    world_sizes: tuple[int | str, ...]
    scenarios: tuple[str, ...]
    examples_per_scenario: int
    hypothesis_seed: int
    hypothesis_profile: str
    axes: dict[str, tuple[str, ...]]
    stacks: dict[str, dict[str, str]]
    implied: tuple[Implied, ...]
    exclusions: tuple[Exclusion, ...]
    install_timeout_s: float
    job_timeout_s: float
    worker_start_timeout_s: float
    no_build_isolation: tuple[str, ...]
    build_requires: tuple[str, ...]
    extra_requirements: tuple[str, ...]
    install_env: dict[str, str]
    install_mode: str = "uv"
    #: Wheels layered in system mode whenever the node lacks them (deepspeed's hjson, pydantic, ...).
    overlay_support: tuple[str, ...] = ()
    #: With a date axis: packages resolved against today's index instead of the cell's date (a bitsandbytes
    #: that can quantize on CPU), as requirement lines.
    outside_era: tuple[str, ...] = ()
    #: The day `outside_era` packages are resolved as of (default: the newest day of the date axis).
    outside_era_day: str | None = None
    #: A dated profile over a node's own torch (system mode): the packages installed at each day's versions
    #: from the profile's era lock (matrix/locks/<name>.json); the rest of the day's stack is the node's own
    #: where it meets their requirements (harness/versions/lock.py).
    era_packages: tuple[str, ...] = ()
    #: The node image the era lock plans against: matrix/nodes/<node_image>.json (its python, torch, pip list).
    node_image: str | None = None
    #: System mode: packages a cell leaves out of its overlay when they cannot be imported over the node's stack
    #: (a bitsandbytes with no library for the node's CUDA), so the scenarios that need none of them still run;
    #: each record's `install.left_out` says what was left out and why.
    optional: tuple[str, ...] = ()
    scenario_settings: dict[str, ScenarioSettings] = field(default_factory=dict)
    retry: RetryPolicy = RetryPolicy()
    #: Address-space limit per worker process (CPU only): a runaway allocation becomes a recorded OOM crash.
    worker_memory_mb: int | None = None
    #: "none" (the full product) or "pairwise" (every pair of values of two dimensions in some cell).
    reduce: str = "none"
    #: "all": explicit examples run every variant; "where-baseline-fails": their baseline first and the other
    #: variants only where it fails, like drawn configs (wide profiles: the seed configs, fixes and controls).
    example_variants: str = "all"
    #: Replay failures earlier runs saved (results/hypothesis-db) besides the draws; off for a profile that must run
    #: the same configs on every machine and in a fixed time (the coffee-break default).
    failure_memory: bool = True

    def settings_for(self, scenario_id: str) -> ScenarioSettings:
        return self.scenario_settings.get(scenario_id, ScenarioSettings())


def profile_path(name_or_path: str, matrix_dir: Path) -> Path:
    """A profile name ('cpu') resolves to matrix/cpu.toml; an existing path is used as is."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml":
        return candidate
    return matrix_dir / f"{name_or_path}.toml"


def available_profiles(matrix_dir: Path) -> list[str]:
    return sorted(p.stem for p in matrix_dir.glob("*.toml"))


def _world_sizes(shown: str, value: Any) -> tuple[int | str, ...]:
    """`world_size = 2`, `[1, 2, 4]` (an axis: one cell per value) or "all-gpus"."""
    values = value if isinstance(value, list) else [value]
    if not values or len(set(map(str, values))) != len(values):
        raise ProfileError(shown, "profile.world_size", f"must list distinct world sizes, got {value!r}")
    for item in values:
        if not (item == "all-gpus" or (isinstance(item, int) and not isinstance(item, bool) and item >= 1)):
            raise ProfileError(
                shown, "profile.world_size", f"must be positive integers or 'all-gpus', got {item!r} in {value!r}"
            )
    return tuple(values)


def load_profile(name_or_path: str, matrix_dir: Path) -> Profile:
    """Read and validate a profile; raise ProfileError naming the file and key on any problem."""
    path = profile_path(name_or_path, matrix_dir)
    shown = str(path)
    if not path.is_file():
        known = ", ".join(available_profiles(matrix_dir)) or "none"
        raise ProfileError(shown, "profile", f"no such profile (available: {known})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(shown, "toml", f"malformed TOML: {exc}") from None
    return _parse(path, data)


def _parse(path: Path, data: dict[str, Any]) -> Profile:
    shown = str(path)
    _reject_unknown(shown, "", data, PROFILE_KEYS)
    head = _table(shown, "profile", data.get("profile", {}))
    _reject_unknown(shown, "profile.", head, PROFILE_SECTION_KEYS)

    device = _str(shown, "profile.device", head.get("device", "auto"))
    if device not in DEVICES:
        raise ProfileError(shown, "profile.device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
    world_sizes = _world_sizes(shown, head.get("world_size", 2))
    python = _str(shown, "profile.python", head.get("python", "3.11"))
    _version(shown, "profile.python", python)

    axes = _parse_axes(shown, data.get("axes", {}))
    stacks = _parse_stacks(shown, data.get("stacks", {}), axes)
    if not axes and not stacks:
        raise ProfileError(shown, "axes", "a profile needs at least one axis or stack")
    timeouts = _table(shown, "timeouts", data.get("timeouts", {}))
    _reject_unknown(shown, "timeouts.", timeouts, TIMEOUT_KEYS)
    install = _table(shown, "install", data.get("install", {}))
    _reject_unknown(shown, "install.", install, INSTALL_KEYS)
    install_env = _table(shown, "install.env", install.get("env", {}))
    for key, value in install_env.items():
        _str(shown, f"install.env.{key}", value)
    install_mode = _str(shown, "install.mode", install.get("mode", "uv"))
    if install_mode not in INSTALL_MODES:
        raise ProfileError(shown, "install.mode", f"must be one of {', '.join(INSTALL_MODES)}, got {install_mode!r}")
    if install_mode != "system":
        for key, value in _all_pins(axes, stacks):
            if value == SYSTEM:
                raise ProfileError(shown, key, "'system' needs [install] mode = \"system\"")

    used = [p for p in AXIS_PACKAGES if p in axes or any(p in table for table in stacks.values())]
    return Profile(
        name=path.stem,
        path=path,
        description=_str(shown, "profile.description", head.get("description", "")),
        python=python,
        device=device,
        world_sizes=world_sizes,
        scenarios=tuple(_str_list(shown, "profile.scenarios", head.get("scenarios", ["*"]), allow_empty=False)),
        examples_per_scenario=_non_negative_int(
            shown, "profile.examples_per_scenario", head.get("examples_per_scenario", 3)
        ),
        hypothesis_seed=_int(shown, "profile.hypothesis_seed", head.get("hypothesis_seed", 0)),
        hypothesis_profile=_str(shown, "profile.hypothesis_profile", head.get("hypothesis_profile", "ci")),
        axes=axes,
        stacks=stacks,
        implied=tuple(_parse_implied(shown, data.get("implied", []))),
        exclusions=tuple(_parse_exclusions(shown, data.get("exclude", []), axes, stacks)),
        install_timeout_s=_positive_number(shown, "timeouts.install_s", timeouts.get("install_s", 900)),
        job_timeout_s=_positive_number(shown, "timeouts.job_s", timeouts.get("job_s", 300)),
        worker_start_timeout_s=_positive_number(shown, "timeouts.worker_start_s", timeouts.get("worker_start_s", 180)),
        # The package table's install quirks for the packages this profile uses, plus any the profile adds.
        no_build_isolation=_merged(
            packages.late_installed(used),
            _str_list(shown, "install.no_build_isolation", install.get("no_build_isolation", [])),
        ),
        build_requires=_merged(
            packages.build_requirements(used),
            _str_list(shown, "install.build_requires", install.get("build_requires", [])),
        ),
        extra_requirements=tuple(_str_list(shown, "install.extra", install.get("extra", []))),
        install_env=packages.build_env(used) | dict(install_env),
        install_mode=install_mode,
        overlay_support=tuple(_str_list(shown, "install.overlay_support", install.get("overlay_support", []))),
        outside_era=_outside_era(shown, install.get("outside_era", []), axes),
        era_packages=_era_packages(shown, install, axes, install_mode),
        node_image=_node_image(shown, install, install_mode),
        optional=_optional(shown, install, install_mode),
        scenario_settings=_parse_scenarios(shown, data.get("scenario", {})),
        retry=_parse_retry(shown, data.get("retry", {})),
        reduce=_one_of(shown, "profile.reduce", head.get("reduce", "none"), ("none", "pairwise")),
        example_variants=_one_of(
            shown, "profile.example_variants", head.get("example_variants", "all"), ("all", "where-baseline-fails")
        ),
        worker_memory_mb=_parse_limits(shown, data.get("limits", {}), device),
        failure_memory=_bool(shown, "profile.failure_memory", head.get("failure_memory", True)),
    )


def _merged(first: list[str], then: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*first, *then]))


def _one_of(shown: str, key: str, raw: Any, allowed: tuple[str, ...]) -> str:
    value = _str(shown, key, raw)
    if value not in allowed:
        raise ProfileError(shown, key, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _parse_retry(shown: str, raw: Any) -> RetryPolicy:
    table = _table(shown, "retry", raw)
    _reject_unknown(shown, "retry.", table, RETRY_KEYS)
    outcomes = tuple(_str_list(shown, "retry.outcomes", table.get("outcomes", list(RETRY_OUTCOMES))))
    for outcome in outcomes:
        if outcome not in RETRY_OUTCOMES:
            raise ProfileError(shown, "retry.outcomes", f"{outcome!r} is not one of {', '.join(RETRY_OUTCOMES)}")
    scope = _str(shown, "retry.scope", table.get("scope", "first-per-signature"))
    if scope not in RETRY_SCOPES:
        raise ProfileError(shown, "retry.scope", f"must be one of {', '.join(RETRY_SCOPES)}, got {scope!r}")
    return RetryPolicy(_non_negative_int(shown, "retry.times", table.get("times", 1)), outcomes, scope)


def _parse_limits(shown: str, raw: Any, device: str) -> int | None:
    table = _table(shown, "limits", raw)
    _reject_unknown(shown, "limits.", table, LIMIT_KEYS)
    if "worker_memory_mb" not in table:
        return None
    if device == "cuda":
        raise ProfileError(shown, "limits.worker_memory_mb", "an address-space limit breaks CUDA; CPU profiles only")
    value = _non_negative_int(shown, "limits.worker_memory_mb", table["worker_memory_mb"])
    if value < 512:
        raise ProfileError(shown, "limits.worker_memory_mb", "must be at least 512 (torch alone needs more)")
    return value


def _all_pins(axes: dict[str, tuple[str, ...]], stacks: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    pins = [(f"axes.{pkg}", v) for pkg, values in axes.items() for v in values]
    return pins + [(f"stacks.{name}.{pkg}", v) for name, table in stacks.items() for pkg, v in table.items()]


def _parse_axes(shown: str, raw: Any) -> dict[str, tuple[str, ...]]:
    """Versions per package: a list of pins, or a release rule (a string) resolved when the run starts. The
    `date` axis: days (YYYY-MM-DD), or a date rule such as 'peft minors >=0.9'."""
    axes = _table(shown, "axes", raw)
    parsed: dict[str, tuple[str, ...]] = {}
    for package, values in axes.items():
        key = f"axes.{package}"
        if package == DATE_AXIS:
            parsed[package] = _parse_dates(shown, key, values)
            continue
        _known_package(shown, key, package, AXIS_PACKAGES)
        if isinstance(values, str) and values not in (LATEST, ABSENT, SYSTEM):
            parse_rule(shown, key, values)
            parsed[package] = (RULE_PREFIX + values,)
            continue
        items = _str_list(shown, key, values, allow_empty=False)
        for item in items:
            _pin_value(shown, key, item)
        if len(set(items)) != len(items):
            raise ProfileError(shown, key, "lists a version twice")
        parsed[package] = tuple(items)
    return parsed


@dataclass(frozen=True)
class DateRule:
    """'<package> minors <specifier>': the day after each minor release of `package` in the specifier first
    appeared on the index (that minor is then the newest), plus today."""

    package: str
    specifier: SpecifierSet


def parse_date_rule(shown: str, key: str, text: str) -> DateRule:
    words = text.split(maxsplit=2)
    if len(words) >= 2 and words[1] == "minors" and words[0] in AXIS_PACKAGES:
        try:
            return DateRule(words[0], SpecifierSet(words[2] if len(words) > 2 else ""))
        except InvalidSpecifier:
            pass
    raise ProfileError(
        shown, key, f"{text!r} is neither a list of days (YYYY-MM-DD) nor a rule like 'peft minors >=0.9'"
    )


def _parse_dates(shown: str, key: str, values: Any) -> tuple[str, ...]:
    if isinstance(values, str):
        parse_date_rule(shown, key, values)
        return (RULE_PREFIX + values,)
    items = _str_list(shown, key, values, allow_empty=False)
    for item in items:
        if not _DATE.match(item) and not PROBE_DAY.match(item):
            raise ProfileError(shown, key, f"{item!r} is not a day (YYYY-MM-DD)")
    if len(set(items)) != len(items):
        raise ProfileError(shown, key, "lists a day twice")
    return tuple(items)


def _requirement(shown: str, key: str, line: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        name = Requirement(line).name.lower()
    except InvalidRequirement as exc:
        raise ProfileError(shown, key, f"{line!r} is not a requirement: {exc}") from None
    if name not in AXIS_PACKAGES + SUPPORT_PACKAGES:
        raise ProfileError(shown, key, f"{name!r} is not a package of harness/define/packages.py")


def _era_packages(shown: str, install: dict[str, Any], axes: dict[str, tuple[str, ...]], mode: str) -> tuple[str, ...]:
    names = _str_list(shown, "install.era_packages", install.get("era_packages", []))
    probes = [d for d in axes.get(DATE_AXIS, ()) if PROBE_DAY.match(d)]
    if probes and not names:
        raise ProfileError(shown, "axes.date", f"{probes[0]!r}: probe days belong to era-locked profiles only")
    if names and (DATE_AXIS not in axes or mode != "system"):
        raise ProfileError(shown, "install.era_packages", 'needs a date axis and [install] mode = "system"')
    if names and "node_image" not in install:
        raise ProfileError(shown, "install.era_packages", "needs install.node_image (the image the lock plans for)")
    return tuple(names)


def _optional(shown: str, install: dict[str, Any], mode: str) -> tuple[str, ...]:
    names = _str_list(shown, "install.optional", install.get("optional", []))
    if names and mode != "system":
        raise ProfileError(shown, "install.optional", 'applies to overlays over a node: [install] mode = "system"')
    return tuple(names)


def _node_image(shown: str, install: dict[str, Any], mode: str) -> str | None:
    if "node_image" not in install:
        return None
    name = _str(shown, "install.node_image", install["node_image"])
    if mode != "system" or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ProfileError(shown, "install.node_image", 'a file name in matrix/nodes/, with mode = "system"')
    return name


def _outside_era(shown: str, raw: Any, axes: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    lines = _str_list(shown, "install.outside_era", raw)
    if lines and DATE_AXIS not in axes:
        raise ProfileError(shown, "install.outside_era", "only means something with a date axis")
    for line in lines:
        _requirement(shown, "install.outside_era", line)
    return tuple(lines)


@dataclass(frozen=True)
class ReleaseRule:
    """`latest N`, or a specifier, optionally followed by `newest-patch` (the newest patch of every minor)."""

    latest: int | None
    specifier: SpecifierSet | None
    newest_patch: bool


def parse_rule(shown: str, key: str, text: str) -> ReleaseRule:
    words = text.split()
    newest_patch = bool(words) and words[-1] == "newest-patch"
    if newest_patch:
        words = words[:-1]
    if len(words) == 2 and words[0] == "latest" and words[1].isdigit() and int(words[1]) > 0:
        return ReleaseRule(int(words[1]), None, newest_patch)
    try:
        return ReleaseRule(None, SpecifierSet(" ".join(words)), newest_patch)
    except InvalidSpecifier:
        raise ProfileError(
            shown,
            key,
            f"{text!r} is neither a version list nor a rule ('latest N' or a specifier such as "
            "'>=4.40,<5', optionally followed by 'newest-patch')",
        ) from None


def _parse_stacks(shown: str, raw: Any, axes: dict[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
    stacks = _table(shown, "stacks", raw)
    parsed: dict[str, dict[str, str]] = {}
    members: set[str] | None = None
    for stack_name, pins in stacks.items():
        key = f"stacks.{stack_name}"
        table = _table(shown, key, pins)
        if not table:
            raise ProfileError(shown, key, "a stack needs at least one package")
        for package, value in table.items():
            _known_package(shown, f"{key}.{package}", package, AXIS_PACKAGES)
            _pin_value(shown, f"{key}.{package}", _str(shown, f"{key}.{package}", value))
            if package in axes:
                raise ProfileError(
                    shown, f"{key}.{package}", "is also an axis; a package is either an axis or in stacks"
                )
        if members is not None and set(table) != members:
            raise ProfileError(shown, key, f"names packages {sorted(table)}, other stacks name {sorted(members)}")
        members = set(table)
        parsed[stack_name] = dict(table)
    return parsed


def _parse_implied(shown: str, raw: Any) -> list[Implied]:
    if not isinstance(raw, list):
        raise ProfileError(shown, "implied", "must be an array of tables ([[implied]])")
    rules = []
    for index, item in enumerate(raw):
        key = f"implied[{index}]"
        table = _table(shown, key, item)
        _reject_unknown(shown, f"{key}.", table, {"when", "pins"})
        when = _table(shown, f"{key}.when", table.get("when"))
        pins = _table(shown, f"{key}.pins", table.get("pins"))
        if not when or not pins:
            raise ProfileError(shown, key, "needs both 'when' and 'pins'")
        rules.append(
            Implied(
                when={
                    pkg: _specifier(
                        shown,
                        f"{key}.when.{pkg}",
                        _known_package(shown, f"{key}.when.{pkg}", pkg, AXIS_PACKAGES) and spec,
                    )
                    for pkg, spec in when.items()
                },
                pins={
                    pkg: str(
                        _specifier(
                            shown,
                            f"{key}.pins.{pkg}",
                            _known_package(shown, f"{key}.pins.{pkg}", pkg, AXIS_PACKAGES + SUPPORT_PACKAGES) and spec,
                        )
                    )
                    for pkg, spec in pins.items()
                },
            )
        )
    return rules


def _parse_exclusions(
    shown: str, raw: Any, axes: dict[str, tuple[str, ...]], stacks: dict[str, dict[str, str]]
) -> list[Exclusion]:
    if not isinstance(raw, list):
        raise ProfileError(shown, "exclude", "must be an array of tables ([[exclude]])")
    rules = []
    for index, item in enumerate(raw):
        key = f"exclude[{index}]"
        table = _table(shown, key, item)
        _reject_unknown(shown, f"{key}.", table, {"when", "reason"})
        when = _table(shown, f"{key}.when", table.get("when"))
        reason = _str(shown, f"{key}.reason", table.get("reason", ""))
        if not when:
            raise ProfileError(shown, f"{key}.when", "must name at least one axis value")
        if not reason.strip():
            raise ProfileError(shown, f"{key}.reason", "an exclusion needs a reason")
        for axis, value in when.items():
            value = _str(shown, f"{key}.when.{axis}", value)
            if axis == "stack":
                if value not in stacks:
                    raise ProfileError(shown, f"{key}.when.stack", f"no stack named {value!r}")
            elif axis not in axes:
                raise ProfileError(shown, f"{key}.when.{axis}", "is not an axis of this profile")
            elif value not in axes[axis]:
                raise ProfileError(shown, f"{key}.when.{axis}", f"{value!r} is not on that axis")
        rules.append(Exclusion(when=dict(when), reason=reason))
    return rules


def _parse_scenarios(shown: str, raw: Any) -> dict[str, ScenarioSettings]:
    table = _table(shown, "scenario", raw)
    parsed = {}
    for scenario_id, settings in table.items():
        key = f"scenario.{scenario_id}"
        body = _table(shown, key, settings)
        _reject_unknown(shown, f"{key}.", body, SCENARIO_KEYS)
        configs = body.get("configs", [])
        if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
            raise ProfileError(shown, f"{key}.configs", "must be an array of tables")
        variants = body.get("variants")
        parsed[scenario_id] = ScenarioSettings(
            examples=_non_negative_int(shown, f"{key}.examples", body["examples"]) if "examples" in body else None,
            seed_examples=_non_negative_int(shown, f"{key}.seed_examples", body["seed_examples"])
            if "seed_examples" in body
            else None,
            job_timeout_s=_positive_number(shown, f"{key}.job_timeout_s", body["job_timeout_s"])
            if "job_timeout_s" in body
            else None,
            variants=tuple(_str_list(shown, f"{key}.variants", variants, allow_empty=False))
            if variants is not None
            else None,
            configs=tuple(configs),
            cells=tuple(_str_list(shown, f"{key}.cells", body["cells"], allow_empty=False))
            if "cells" in body
            else None,
            single_rank=_bool(shown, f"{key}.single_rank", body.get("single_rank", False)),
        )
    return parsed


def _bool(shown: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(shown, key, f"must be true or false, got {value!r}")
    return value


# --- small typed readers: each raises ProfileError naming the key -------------------------------


def _reject_unknown(shown: str, prefix: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ProfileError(shown, f"{prefix}{key}", f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _table(shown: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(shown, key, f"must be a table, got {type(value).__name__}")
    return value


def _str(shown: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ProfileError(shown, key, f"must be a string, got {value!r}")
    return value


def _int(shown: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProfileError(shown, key, f"must be an integer, got {value!r}")
    return value


def _non_negative_int(shown: str, key: str, value: Any) -> int:
    if _int(shown, key, value) < 0:
        raise ProfileError(shown, key, f"must be 0 or more, got {value!r}")
    return value


def _positive_number(shown: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ProfileError(shown, key, f"must be a positive number, got {value!r}")
    return float(value)


def _str_list(shown: str, key: str, value: Any, allow_empty: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProfileError(shown, key, f"must be a list of strings, got {value!r}")
    if not value and not allow_empty:
        raise ProfileError(shown, key, "is empty")
    return value


def _known_package(shown: str, key: str, package: str, allowed: tuple[str, ...]) -> bool:
    if package not in allowed:
        raise ProfileError(shown, key, f"unknown package {package!r} (known: {', '.join(allowed)})")
    return True


def _version(shown: str, key: str, value: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:
        raise ProfileError(shown, key, f"malformed version {value!r}") from None


def _pin_value(shown: str, key: str, value: str) -> None:
    """An axis or stack value is 'latest', 'none' (absent), 'system' or an exact PEP 440 version."""
    if value not in (LATEST, ABSENT, SYSTEM):
        _version(shown, key, value)


def _specifier(shown: str, key: str, value: Any) -> SpecifierSet:
    text = _str(shown, key, value)
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise ProfileError(shown, key, f"malformed version specifier {text!r}") from None
