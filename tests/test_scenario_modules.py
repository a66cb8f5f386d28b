"""Scenario modules keep the contract: importable without torch, valid specs, no harness imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

from harness.define.registry import discover
from tests.conftest import REPO_ROOT

VARIANT = re.compile(r"^[a-z0-9_\-]+(\+[a-z0-9_\-]+)*$")


def test_importing_scenarios_does_not_import_the_stack() -> None:
    code = (
        "import json, sys; from harness.define.registry import discover; discover(); "
        "print(json.dumps(sorted(m for m in ('torch','transformers','peft','deepspeed','bitsandbytes') "
        "if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert json.loads(out.stdout) == []


def _imported_modules(folder: str) -> list[tuple[str, str]]:
    """(file, module) for every import statement in a folder's Python files, at any depth of the code."""
    found = []
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(REPO_ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.append((str(path.relative_to(REPO_ROOT)), node.module or ""))
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def test_scenarios_and_the_runtime_never_import_harness() -> None:
    """The cell side (runtime/, scenarios/) runs in environments that do not have the orchestrator's packages."""
    wrong = [
        (f, m) for folder in ("scenarios", "runtime") for f, m in _imported_modules(folder) if _top(m) == "harness"
    ]
    assert wrong == []


def test_the_harness_never_imports_torch_or_the_stack() -> None:
    """By folder: everything under harness/ runs in the orchestrator's light venv, which has no ML stack."""
    stack = {"torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "runtime"}
    wrong = [(f, m) for f, m in _imported_modules("harness") if _top(m) in stack]
    assert wrong == []


def test_specs_are_well_formed() -> None:
    ids = set()
    for scenario in discover():
        spec = scenario.spec
        assert re.match(r"^S\d+-[a-z0-9\-]+$", spec["id"]), spec["id"]
        assert spec["id"] not in ids
        ids.add(spec["id"])
        assert scenario.variants[0] == "baseline"
        assert all(VARIANT.match(v) for v in spec["variants"]), spec["variants"]
        # The verdict contract: what the scenario exists for, what should pass, and what each variant changes.
        assert isinstance(spec["target"], list) and isinstance(spec["controls"], list)
        kinds = {scenario.variant_kind(v) for v in scenario.variants}
        assert spec["target"] or not kinds & {"fix", "workaround"}, "fixes need a target failure to fix"
        assert all(scenario.variant_description(v).strip() for v in scenario.variants)
        assert spec.get("device", "any") in ("cpu", "cuda", "any")
        assert int(spec.get("world_size", 1)) >= 1
        assert spec.get("known_issues"), "every scenario links its upstream history"
        assert callable(scenario.module.run)


def test_a_spec_that_breaks_the_contract_is_named() -> None:
    import pytest

    from harness.define.registry import validate_spec
    from harness.errors import UsageError

    good = {
        "id": "S9-x",
        "title": "t",
        "target": ["no-grad-element-0"],
        "controls": [],
        "variants": {"baseline": ("baseline", "default"), "fix_a": ("fix", "flag a")},
    }
    typed = validate_spec("scenarios.s9_x", good)
    assert (typed.world_size, typed.device, typed.target, typed.restart_after_failure) == (1, "any", (
        "no-grad-element-0",), True)  # fmt: skip
    broken = [
        ({"target": "sig"}, "SPEC.target"),
        ({"target": ["no-such-failure"]}, "SPEC.target"),
        ({"variants": {"baseline": ("baseline", "d"), "fix_a": ("cure", "x")}}, "SPEC.variants.fix_a"),
        ({"variants": {"fix_a": ("fix", "x")}}, "SPEC.variants"),
        ({"variants": {"baseline": ("baseline", "d"), "fix_a": ("fix", "")}}, "SPEC.variants.fix_a"),
        ({"target": []}, "SPEC.target"),
        ({"controls": [{}]}, "SPEC.controls"),
        ({"world_sise": 2}, "SPEC.world_sise"),  # a typo of a key: refused, never read as the default
        ({"world_size": "2"}, "SPEC.world_size"),
        ({"flips_per_config": "yes"}, "SPEC.flips_per_config"),
        ({"device": "gpu"}, "SPEC.device"),
        ({"variant_setup": {"fix_b": {"use_reentrant": "true"}}}, "SPEC.variant_setup.fix_b"),
    ]
    for change, key in broken:
        with pytest.raises(UsageError, match=key.replace(".", r"\.")):
            validate_spec("scenarios.s9_x", good | change)
