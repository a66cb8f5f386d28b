"""Write one self-contained reproducer per distinct failure: `results/repros/<id>.py`.

A distinct failure is (cell, scenario, variant, signature). Its reproducer holds the scenario's own
code verbatim (scenarios never import harness/, which is what makes this possible), the helper
modules it imports as embedded sources, the minimal config where the failure was shrunk, and PEP 723
metadata pinning the cell's exact versions, so `uv run <file>` rebuilds the cell anywhere. A
distributed scenario starts itself under torchrun. `--variant NAME` runs a fix variant instead,
which is how a fix that worked in the cell is checked to still work.
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.define.packages import PINNED_PACKAGES, public_version
from harness.define.registry import SCENARIO_DIR, Scenario
from harness.planning.draws import config_id
from harness.textsafe import slug

RESULT_PREFIX = "REPRO-RESULT "

#: `from scenarios.kit import models, checks` / `from scenarios import compat`: what a scenario's helpers are.
_IMPORT = re.compile(r"^\s*from (scenarios(?:\.\w+)*) import (?:\(([^)]*)\)|([^\n#]+))", re.M)
REPO_ROOT = SCENARIO_DIR.parent
#: The cell-side code every reproducer embeds, so it runs a job the way the worker does.
RUNTIME_MODULES = ("runtime.job",)


def repro_id(record: dict[str, Any]) -> str:
    """A readable, filesystem-safe id: scenario, cell, variant, signature, and a short hash of all four.
    Every part is slugged: record text never becomes a path separator or `..`."""
    key = "|".join(str(record[k]) for k in ("cell", "scenario", "variant", "signature"))
    short = config_id({"key": key})[:8]
    parts = (str(record["scenario"]).split("-")[0], record["cell"], record["variant"], record["signature"])
    return "-".join(slug(part, 64 if i == 1 else 48) for i, part in enumerate(parts)) + f"-{short}"


def distinct_failures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One representative record per (cell, scenario, variant, signature): a shrunk one if there is one."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("outcome") == "fail" and record.get("signature"):
            groups[tuple(record[k] for k in ("cell", "scenario", "variant", "signature"))].append(record)
    chosen = []
    for group in groups.values():
        shrunk = [r for r in group if r.get("minimal_config")]
        pool = shrunk or group
        chosen.append(min(pool, key=lambda r: len(json.dumps(_repro_config(r), sort_keys=True))))
    return sorted(chosen, key=repro_id)


def _repro_config(record: dict[str, Any]) -> dict[str, Any]:
    return record.get("minimal_config") or record["config"]


Passes = dict[tuple[str, str, str], list[str]]


def passes_by_config(records: list[dict[str, Any]]) -> Passes:
    """(cell, scenario, config id) -> the variants that passed there, sorted: read once for every reproducer."""
    found: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in records:
        if r.get("outcome") == "pass":
            found[(r["cell"], r["scenario"], r["config_id"])].append(r["variant"])
    return {key: sorted(variants) for key, variants in found.items()}


def passing_fixes(passes: Passes, failure: dict[str, Any]) -> list[str]:
    """Variants that passed on the failing record's config in the same cell."""
    return passes.get((failure["cell"], failure["scenario"], failure["config_id"]), [])


def write_repros(
    records: list[dict[str, Any]], scenarios: dict[str, Scenario], out_dir: Path, python: str = "3.11"
) -> list[Path]:
    """Write (or rewrite) a reproducer for every distinct failure; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    passes = passes_by_config(records)
    for failure in distinct_failures(records):
        scenario = scenarios.get(failure["scenario"])
        if scenario is None:
            continue
        path = out_dir / f"{repro_id(failure)}.py"
        path.write_text(render(failure, scenario, passing_fixes(passes, failure), python))
        written.append(path)
    return written


def sync_repros(
    records: list[dict[str, Any]], scenarios: dict[str, Scenario], out_dir: Path
) -> tuple[list[Path], list[dict[str, Any]]]:
    """Make `out_dir` mirror the published table: a reproducer per distinct failure in these records,
    an index.json describing them, and no reproducer of a failure the table no longer shows. Returns the files
    written and the index (what matrix.json links each failure to)."""
    written = write_repros(records, scenarios, out_dir)
    keep = {p.name for p in written}
    for stale in out_dir.glob("*.py"):
        if stale.name not in keep:
            stale.unlink()
    index = []
    passes = passes_by_config(records)
    for failure in distinct_failures(records):
        if failure["scenario"] in scenarios:
            index.append(
                {
                    "file": f"{repro_id(failure)}.py",
                    "run_id": failure.get("run_id"),
                    "cell": failure["cell"],
                    "scenario": failure["scenario"],
                    "variant": failure["variant"],
                    "signature": failure["signature"],
                    "config_id": failure["config_id"],
                    "minimal_config_id": failure.get("minimal_config_id"),
                    "distributed": int(scenarios[failure["scenario"]].spec.get("world_size", 1)) > 1,
                    "device": (failure.get("hardware") or {}).get("device", "cpu"),
                    "passing_fixes": [v for v in passing_fixes(passes, failure) if v != failure["variant"]],
                }
            )
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return written, index


def check_repro(
    path: Path, entry: dict[str, Any], variant: str | None = None, timeout_s: float = 1200
) -> dict[str, Any]:
    """Run one reproducer with `uv run` (a fresh environment from its PEP 723 pins) and classify what it did.

    Expected: the entry's signature for its own variant, `pass` for a fix variant."""
    import os
    import shutil
    import subprocess
    import sys
    import time

    from harness.recording.signatures import classify

    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    env = dict(os.environ)
    if env.get("PIP_FIND_LINKS") and not env.get("UV_FIND_LINKS"):
        env["UV_FIND_LINKS"] = env["PIP_FIND_LINKS"]
    command = [uv, "run", "--quiet", "--script", str(path)] + (["--variant", variant] if variant else [])
    started = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return {"expected": "?", "observed": "timeout", "ok": False, "seconds": round(time.monotonic() - started, 1)}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if lines:
        detail = json.loads(lines[-1][len(RESULT_PREFIX) :])
        verdict = classify(detail["status"], detail)
        observed = verdict.signature or verdict.outcome
    else:
        observed = f"no result (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:] or ''}"
    expected = entry["signature"] if variant in (None, entry["variant"]) else "pass"
    return {
        "expected": expected,
        "observed": observed,
        "ok": observed == expected,
        "returncode": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "output": proc.stdout[-2000:] + proc.stderr[-2000:],
    }


#: What may stand in a PEP 723 dependency line: a distribution name and a version, nothing else.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.!+_-]*$")
_PYTHON = re.compile(r"^[0-9]+\.[0-9]+$")


def render(failure: dict[str, Any], scenario: Scenario, fixes: list[str], python: str) -> str:
    """The reproducer's text. Record text reaches it only as data: the failing config and the recorded facts
    are one JSON document embedded as a string literal (parsed at run time), versions are checked against the
    shape of a version before they become PEP 723 lines, and the docstring gets flattened, quote-free text."""
    versions = {str(k): str(v) for k, v in (failure.get("versions") or {}).items()}
    recorded_python = ".".join(versions.get("python", "").split(".")[:2])
    if _PYTHON.match(recorded_python):
        python = recorded_python  # the cell's own interpreter line
    if str((failure.get("install") or {}).get("mode", "")).startswith("system"):
        # A node's preinstalled stack (CUDA builds, local packages) is not on an index: pin what decides it.
        versions = {k: v for k, v in versions.items() if k in PINNED_PACKAGES}
    # Every distribution the cell had, at its exact version: the reproducer rebuilds the cell, not a cousin.
    deps = [
        f"{name}=={public_version(v)}"
        for name, v in sorted(versions.items())
        if name != "python" and _NAME.match(name) and _VERSION.match(public_version(v))
    ]
    if "hypothesis" not in versions:
        deps.append("hypothesis")  # scenarios build their strategy at import
    source = _source(scenario.module.__file__ or "")
    helpers = _helper_sources(source)
    scenario_code = source.replace("from __future__ import annotations\n", "", 1)
    world_size = int(scenario.spec.get("world_size", 1))
    device = "cuda" if (failure.get("hardware") or {}).get("device") == "cuda" else "cpu"
    name = repro_id(failure)
    fix_variants = [slug(v) for v in fixes if v != failure["variant"]]
    data = {
        "config": _repro_config(failure),
        "variant": failure["variant"],
        "signature": failure["signature"],
        "world_size": world_size,
        "device": device,
        "run_id": failure.get("run_id"),
        "cell": failure["cell"],
        "config_id": failure["config_id"],
        "message": (failure.get("message") or "")[:600],
        "fixes": fix_variants,
    }
    launch = f"uv run {name}.py  " + (
        f"(starts itself under torchrun with {world_size} ranks)" if world_size > 1 else "(single process)"
    )
    shrunk = (
        f"Config: the minimal one Hypothesis shrank the failure to (from {failure['config_id']})."
        if failure.get("minimal_config")
        else f"Config: {failure.get('config_source', 'example')} config {failure['config_id']}."
    )
    fix_lines = "\n".join(f"    uv run {name}.py --variant {v}" for v in fix_variants)
    first_line = next(iter((failure.get("message") or "").strip().splitlines()), "")
    docstring = "\n".join(
        [
            f"Reproducer: {scenario.id}, variant {failure['variant']}, fails with {failure['signature']}.",
            "",
            f"Seen in run {failure.get('run_id')} in cell {failure['cell']} on {device}.",
            f"Message there: {first_line[:300]}",
            shrunk,
            "",
            "Run:",
            f"    {launch}",
            "On CPU, point uv at the CPU torch wheel (e.g. UV_FIND_LINKS=/opt/wheels or",
            "UV_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu); a CUDA node runs it on its GPUs.",
            "Exit 1 and a REPRO-RESULT line with the exception when it reproduces; exit 0 when it passes.",
            "",
            f"Fix variants that passed in that cell on config {failure['config_id']} (each should exit 0 here too):",
            fix_lines or "    (none)",
            "",
            "Generated by the compat-matrix harness from the run's records. Do not edit: regenerate.",
        ]
    )
    helper_block = "\n".join(f"_HELPERS[{module!r}] = {text!r}" for module, text in helpers.items())
    return _TEMPLATE.format(
        python=python,
        deps="\n".join(f"#   {json.dumps(d)}," for d in deps),
        docstring="\n".join(_doc_line(line) for line in docstring.split("\n")),
        helpers=helper_block or "pass",
        scenario_code=scenario_code,
        data=repr(json.dumps(data, sort_keys=True, ensure_ascii=True, default=repr)),
    )


def _doc_line(text: str) -> str:
    """One line of the raw docstring: printable characters only, no double quote (so nothing from a record
    can close the string), whitespace runs kept as they are for the indented command lines."""
    kept = "".join(ch if ch.isprintable() else " " for ch in text)
    return kept.replace('"', "'").rstrip()


@functools.cache
def _source(path: str) -> str:
    """A module's source, read once per process (every reproducer of a scenario embeds the same)."""
    return Path(path).read_text()


@functools.cache
def _helper_sources(source: str) -> dict[str, str]:
    """Sources of the scenarios.* modules a scenario imports, transitively, by dotted name, plus the runtime's
    job module: everything the reproducer needs besides the stack."""
    found: dict[str, str] = {name: _source(str(_module_file(name))) for name in RUNTIME_MODULES}
    todo = [source]
    while todo:
        text = todo.pop()
        for package, wrapped, plain in _IMPORT.findall(text):
            names = (wrapped or plain).replace("\n", " ").split(",")
            for name in (n.split(" as ")[0].strip() for n in names if n.strip()):
                module = f"{package}.{name}" if _module_file(f"{package}.{name}").is_file() else package
                if module in found or not _module_file(module).is_file():
                    continue
                found[module] = _source(str(_module_file(module)))
                todo.append(found[module])
    return dict(sorted(found.items()))


def _module_file(dotted: str) -> Path:
    return REPO_ROOT.joinpath(*dotted.split(".")).with_suffix(".py")


_TEMPLATE = '''#!/usr/bin/env python3
# /// script
# requires-python = "=={python}.*"
# dependencies = [
{deps}
# ]
# ///
r"""{docstring}
"""

from __future__ import annotations

import argparse
import json
import os
import importlib.abc
import importlib.util
import sys
import types

# ------------------------------------------------------------------ embedded modules, verbatim
# The scenario's helpers (scenarios.*) and the harness's job runner (runtime.job), by dotted name.
_HELPERS: dict[str, str] = {{}}
{helpers}


class _Embedded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import `scenarios.*` and `runtime.*` from the embedded sources (ahead of any checkout on sys.path),
    each when first imported, so the modules may import each other in any order."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        package = any(key.startswith(name + ".") for key in _HELPERS)
        if name in _HELPERS or package:
            return importlib.util.spec_from_loader(name, self, is_package=package)
        return None

    def create_module(self, spec: object) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        text = _HELPERS.get(module.__name__)
        if text is not None:
            path = module.__name__.replace(".", "/") + ".py"
            exec(compile(text, f"<{{path}}>", "exec"), module.__dict__)


sys.meta_path.insert(0, _Embedded())

from runtime.job import init_distributed, run_job  # noqa: E402  (embedded above)

# ------------------------------------------------------------------ the scenario, verbatim
{scenario_code}

# ------------------------------------------------------------------ the failing config and how to run it
# The recorded facts, as data: one JSON document, parsed here (never pasted in as code).
RECORDED = json.loads({data})
REPRO_CONFIG = RECORDED["config"]
REPRO_VARIANT = RECORDED["variant"]
EXPECTED_SIGNATURE = RECORDED["signature"]
REPRO_WORLD_SIZE = int(RECORDED["world_size"])
RECORDED_DEVICE = RECORDED["device"]


def _device() -> str:
    if RECORDED_DEVICE == "cuda" and os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        import torch

        if torch.cuda.is_available():
            return "cuda"
    return "cpu"


def _relaunch_under_torchrun(device: str) -> None:
    env = dict(os.environ)
    if device == "cpu":
        env.update({{"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={{REPRO_WORLD_SIZE}}", "--max-restarts=0", sys.argv[0], *sys.argv[1:]]
    os.execve(sys.executable, command, env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default=REPRO_VARIANT, help="variant to run (default: the failing one)")
    args = parser.parse_args()
    device = os.environ.get("REPRO_DEVICE") or _device()
    os.environ["REPRO_DEVICE"] = device
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if REPRO_WORLD_SIZE > 1 and "RANK" not in os.environ:
        _relaunch_under_torchrun(device)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and SPEC.get("process_group") != "scenario":  # a scenario may start its own group
        init_distributed(device, local_rank)
    # The worker's own job runner: the same ctx, the same description of an exception.
    result = run_job(run, REPRO_CONFIG, args.variant, device, rank, local_rank, world_size)
    outcome = {{"variant": args.variant, "check": None}} | {{
        k: v for k, v in result.items() if k in ("status", "exc_type", "message", "traceback", "check")
    }}
    if rank == 0:
        print("{result_prefix}" + json.dumps(outcome), flush=True)
        if outcome["status"] != "pass":
            print(f"reproduced a failure; expected signature: {{EXPECTED_SIGNATURE}}", file=sys.stderr)
    return 0 if outcome["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
'''.replace("{result_prefix}", RESULT_PREFIX)
