"""Write one self-contained reproducer per distinct failure: `results/repros/<id>.py`.

A distinct failure is (cell, scenario, variant, signature). Its reproducer holds the scenario's own
code verbatim (scenarios never import harness/, which is what makes this possible), the helper
modules it imports as embedded sources, the minimal config where the failure was shrunk, and PEP 723
metadata pinning the cell's exact versions, so `uv run <file>` rebuilds the cell anywhere. A
distributed scenario starts itself under torchrun. `--variant NAME` runs a fix variant instead,
which is how a fix that worked in the cell is checked to still work.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.draws import config_id
from harness.registry import SCENARIO_DIR, Scenario
from harness.textsafe import slug

RESULT_PREFIX = "REPRO-RESULT "
#: What a reproducer pins for a cell that ran over a GPU node's own python (`--system-torch`).
SYSTEM_MODE_PINS = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "tokenizers",
                    "huggingface-hub", "safetensors", "hypothesis")  # fmt: skip
_IMPORT = re.compile(r"^\s*from scenarios(?:\.(\w+))? import (\w+)", re.M)


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


def passing_fixes(records: list[dict[str, Any]], failure: dict[str, Any]) -> list[str]:
    """Variants that passed on the failing record's config in the same cell."""
    return sorted(
        r["variant"]
        for r in records
        if r["cell"] == failure["cell"]
        and r["scenario"] == failure["scenario"]
        and r["config_id"] == failure["config_id"]
        and r.get("outcome") == "pass"
    )


def write_repros(
    records: list[dict[str, Any]], scenarios: dict[str, Scenario], out_dir: Path, python: str = "3.11"
) -> list[Path]:
    """Write (or rewrite) a reproducer for every distinct failure; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for failure in distinct_failures(records):
        scenario = scenarios.get(failure["scenario"])
        if scenario is None:
            continue
        path = out_dir / f"{repro_id(failure)}.py"
        path.write_text(render(failure, scenario, passing_fixes(records, failure), python))
        written.append(path)
    return written


def sync_repros(records: list[dict[str, Any]], scenarios: dict[str, Scenario], out_dir: Path) -> list[Path]:
    """Make `out_dir` mirror the published table: a reproducer per distinct failure in these records,
    an index.json describing them, and no reproducer of a failure the table no longer shows."""
    written = write_repros(records, scenarios, out_dir)
    keep = {p.name for p in written}
    for stale in out_dir.glob("*.py"):
        if stale.name not in keep:
            stale.unlink()
    index = []
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
                    "passing_fixes": [v for v in passing_fixes(records, failure) if v != failure["variant"]],
                }
            )
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return written


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

    from harness.signatures import classify

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
        versions = {k: v for k, v in versions.items() if k in SYSTEM_MODE_PINS}
    # Every distribution the cell had, at its exact version: the reproducer rebuilds the cell, not a cousin.
    deps = [
        f"{name}=={_public(v)}"
        for name, v in sorted(versions.items())
        if name != "python" and _NAME.match(name) and _VERSION.match(_public(v))
    ]
    if "hypothesis" not in versions:
        deps.append("hypothesis")  # scenarios build their strategy at import
    source = Path(scenario.module.__file__ or "").read_text()
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


def _public(version: str) -> str:
    """Drop a local label (2.13.0+cpu -> 2.13.0): the index decides the build, `==` still matches it."""
    return version.split("+", 1)[0]


def _helper_sources(source: str) -> dict[str, str]:
    """Sources of the scenarios.* modules a scenario imports, transitively."""
    found: dict[str, str] = {}
    todo = [source]
    while todo:
        text = todo.pop()
        for submodule, name in _IMPORT.findall(text):
            module = submodule or name
            if module in found or not (SCENARIO_DIR / f"{module}.py").is_file():
                continue
            found[module] = (SCENARIO_DIR / f"{module}.py").read_text()
            todo.append(found[module])
    return found


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
import sys
import tempfile
import traceback
import types

# ------------------------------------------------------------------ helper modules the scenario imports
_HELPERS: dict[str, str] = {{}}
{helpers}


def _install_helpers() -> None:
    """Make `from scenarios import compat` (and the like) find the embedded sources."""
    package = types.ModuleType("scenarios")
    package.__path__ = []
    sys.modules["scenarios"] = package
    for name in _HELPERS:
        module = types.ModuleType(f"scenarios.{{name}}")
        sys.modules[module.__name__] = module
        setattr(package, name, module)
    for name, text in _HELPERS.items():
        exec(compile(text, f"<scenarios/{{name}}.py>", "exec"), sys.modules[f"scenarios.{{name}}"].__dict__)


_install_helpers()

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


def _init_distributed(device: str, local_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")


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
    if world_size > 1:
        _init_distributed(device, local_rank)
    with tempfile.TemporaryDirectory(prefix="repro-") as workdir:
        ctx = {{"device": device, "rank": rank, "local_rank": local_rank, "world_size": world_size, "workdir": workdir}}
        try:
            run(REPRO_CONFIG, args.variant, ctx)
            outcome = {{"status": "pass", "variant": args.variant}}
        except Exception as exc:
            outcome = {{
                "status": "exception",
                "variant": args.variant,
                "exc_type": f"{{type(exc).__module__}}.{{type(exc).__qualname__}}",
                "message": str(exc)[:4000],
                "traceback": "".join(traceback.format_exception(exc))[-4000:],
                "check": getattr(exc, "check", None),
            }}
    if rank == 0:
        print("{result_prefix}" + json.dumps(outcome), flush=True)
        if outcome["status"] != "pass":
            print(f"reproduced a failure; expected signature: {{EXPECTED_SIGNATURE}}", file=sys.stderr)
    return 0 if outcome["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
'''.replace("{result_prefix}", RESULT_PREFIX)
