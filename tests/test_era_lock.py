"""Era locks and their wheels, without network or GPU.

An air-gapped GPU node installs exactly what its committed era lock says, on top of its own torch, so the lock
must overlay what the era needs and nothing the node already has right: a wrong overlay is a silently wrong
stack on the node. A day that does not resolve must stay in the lock with its reason. The wheels for those
days travel in device calls of at most 64 MiB, so bitsandbytes must lose its libraries for other CUDA
toolkits (and only those), and the days must be packed into calls without losing or reordering any.
"""

from __future__ import annotations

import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from harness.environments.era_wheels import CallPlan, day_pins, plan_calls, trim_cuda_libraries
from harness.errors import UsageError
from harness.versions.lock import ResolutionFailed, build_lock, overlay_for, stub_wheel
from harness.versions.lock_file import LOCK_VERSION, read_lock

PYTHON = "3.12"
IMAGE = {
    "python": "3.12.3",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "packages": {"torch": "2.11.0+cu130", "numpy": "2.5.2", "Safetensors": "0.4.5", "transformers": "4.40.0"},
}
MB = 10**6


def _requires(table: dict[tuple[str, str], list[str]]):
    """A fake index: Requires-Dist of (name, version), nothing for a release not in `table`."""
    return lambda name, version: table.get((name, version), [])


# --- overlay_for ------------------------------------------------------------------------------------------


def test_era_package_at_the_node_version_is_not_overlaid():
    overlay, reasons = overlay_for(
        {"transformers": "4.40.0", "accelerate": "0.30.0"},
        ["transformers", "accelerate"],
        {"transformers": "4.40.0"},
        _requires({}),
        PYTHON,
    )
    assert overlay == {"accelerate": "0.30.0"}
    assert reasons == []


def test_era_package_at_another_version_is_overlaid():
    overlay, reasons = overlay_for(
        {"transformers": "4.36.2"}, ["Transformers"], {"transformers": "4.40.0"}, _requires({}), PYTHON
    )
    assert overlay == {"transformers": "4.36.2"}
    assert reasons == []


def test_dependency_absent_on_the_node_is_added_with_its_reason():
    overlay, reasons = overlay_for(
        {"transformers": "4.36.2", "tokenizers": "0.15.2"},
        ["transformers"],
        {"transformers": "4.40.0"},
        _requires({("transformers", "4.36.2"): ["tokenizers<0.19,>=0.14"]}),
        PYTHON,
    )
    assert overlay == {"tokenizers": "0.15.2", "transformers": "4.36.2"}
    assert len(reasons) == 1
    assert reasons[0].startswith("tokenizers==0.15.2: transformers 4.36.2 needs tokenizers")
    assert "absent on the node" in reasons[0]


def test_dependency_whose_node_version_violates_the_specifier_is_added_at_the_resolved_version():
    overlay, reasons = overlay_for(
        {"accelerate": "0.25.0", "numpy": "1.26.4"},
        ["accelerate"],
        {"numpy": "2.5.2"},
        _requires({("accelerate", "0.25.0"): ["numpy<2.0.0,>=1.17"]}),
        PYTHON,
    )
    assert overlay == {"accelerate": "0.25.0", "numpy": "1.26.4"}
    assert len(reasons) == 1
    assert reasons[0].startswith("numpy==1.26.4: accelerate 0.25.0 needs numpy")
    assert "node has 2.5.2" in reasons[0]


def test_dependency_the_node_meets_is_left_to_the_node():
    overlay, reasons = overlay_for(
        {"accelerate": "0.25.0", "numpy": "1.26.4"},
        ["accelerate"],
        {"numpy": "1.26.0"},
        _requires({("accelerate", "0.25.0"): ["numpy<2.0.0,>=1.17"]}),
        PYTHON,
    )
    assert overlay == {"accelerate": "0.25.0"}
    assert reasons == []


@pytest.mark.parametrize("line", ['foo; sys_platform == "win32"', 'foo; extra == "dev"', 'foo; python_version < "3.9"'])
def test_requirement_whose_marker_does_not_apply_is_ignored(line):
    overlay, reasons = overlay_for(
        {"peft": "0.10.0", "foo": "1.0"}, ["peft"], {}, _requires({("peft", "0.10.0"): [line]}), PYTHON
    )
    assert overlay == {"peft": "0.10.0"}
    assert reasons == []


def test_requirement_whose_marker_applies_on_the_node_is_followed():
    overlay, _ = overlay_for(
        {"peft": "0.10.0", "foo": "1.0"},
        ["peft"],
        {},
        _requires({("peft", "0.10.0"): ['foo; sys_platform == "linux" and python_version >= "3.12"']}),
        PYTHON,
    )
    assert overlay == {"foo": "1.0", "peft": "0.10.0"}


def test_dependency_not_resolved_is_never_added():
    # torch is held (the node's own build): the resolution does not list it, whatever the node has.
    overlay, reasons = overlay_for(
        {"accelerate": "0.25.0"},
        ["accelerate"],
        {"torch": "2.11.0+cu130"},
        _requires({("accelerate", "0.25.0"): ["torch<2.0", "psutil"]}),
        PYTHON,
    )
    assert overlay == {"accelerate": "0.25.0"}
    assert reasons == []


def test_dependencies_of_added_dependencies_are_added_too():
    overlay, reasons = overlay_for(
        {"transformers": "4.36.2", "tokenizers": "0.15.2", "huggingface-hub": "0.20.3", "filelock": "3.13.1"},
        ["transformers"],
        {"huggingface-hub": "0.23.0", "filelock": "3.13.1"},
        _requires(
            {
                ("transformers", "4.36.2"): ["tokenizers<0.19,>=0.14"],
                ("tokenizers", "0.15.2"): ["huggingface_hub<0.21,>=0.16.4"],
                ("huggingface-hub", "0.20.3"): ["filelock", "fsspec>=2023.5.0"],
            }
        ),
        PYTHON,
    )
    assert overlay == {"huggingface-hub": "0.20.3", "tokenizers": "0.15.2", "transformers": "4.36.2"}
    assert len(reasons) == 2
    assert reasons[0].startswith("tokenizers==0.15.2: transformers 4.36.2 needs") and "absent on the node" in reasons[0]
    assert reasons[1].startswith("huggingface-hub==0.20.3: tokenizers 0.15.2 needs") and "node has 0.23.0" in reasons[1]


# --- build_lock, stub_wheel, read_lock --------------------------------------------------------------------


def test_build_lock_keeps_a_failing_day_with_its_reason_and_overlays_the_others():
    seen_requires: list[tuple[str, str]] = []

    def resolve(day: str) -> dict[str, str]:
        if day == "2023-01-15":
            raise ResolutionFailed("why")
        return {"transformers": "4.36.2", "safetensors": "0.4.1", "numpy": "1.26.4"}

    def requires(name: str, version: str) -> list[str]:
        seen_requires.append((name, version))
        return {("transformers", "4.36.2"): ["safetensors>=0.4.1", "numpy>=1.17"]}.get((name, version), [])

    lock = build_lock(["2023-01-15", "2024-01-15"], ["transformers"], ["transformers"], IMAGE, resolve, requires)

    assert lock["lock_version"] == LOCK_VERSION
    assert lock["held"] == {"torch": "2.11.0+cu130"}
    assert lock["node"] == {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0"}
    assert list(lock["days"]) == ["2023-01-15", "2024-01-15"]

    failed = lock["days"]["2023-01-15"]
    assert set(failed) == {"error"}
    assert "2023-01-15" in failed["error"] and "2.11.0+cu130" in failed["error"] and "why" in failed["error"]

    day = lock["days"]["2024-01-15"]
    assert day["resolved"] == {"transformers": "4.36.2", "safetensors": "0.4.1", "numpy": "1.26.4"}
    # The node's "Safetensors" 0.4.5 counts under its canonical name, and meets >=0.4.1; numpy 2.5.2 meets >=1.17.
    assert day["overlay"] == {"transformers": "4.36.2"}
    assert day["overlay_reasons"] == []
    assert seen_requires == [("transformers", "4.36.2")]


def test_stub_wheel_is_a_wheel_of_the_public_version_that_requires_nothing(tmp_path):
    path = stub_wheel(tmp_path, "torch", "2.11.0+cu130")
    assert path == tmp_path / "torch-2.11.0-py3-none-any.whl"
    assert zipfile.is_zipfile(path)
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        assert set(archive.namelist()) == {
            "torch-2.11.0.dist-info/METADATA",
            "torch-2.11.0.dist-info/WHEEL",
            "torch-2.11.0.dist-info/RECORD",
        }
        metadata = Parser().parsestr(archive.read("torch-2.11.0.dist-info/METADATA").decode())
    assert metadata["Name"] == "torch"
    assert metadata["Version"] == "2.11.0"
    assert metadata.get_all("Requires-Dist") is None


def test_read_lock_without_a_lock_names_the_command_that_makes_one(tmp_path):
    with pytest.raises(UsageError, match="harness lock"):
        read_lock(tmp_path / "locks" / "gpu.json")


# --- trim_cuda_libraries ----------------------------------------------------------------------------------


def _wheel(folder: Path, name: str, members: list[str]) -> Path:
    """A wheel holding `members` (each's content its own name), with a RECORD listing them, written last."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    dist_info = "-".join(name.split("-")[:2]) + ".dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        for member in members:
            archive.writestr(member, member.encode())
        record = [f"{member},sha256=x,{len(member)}" for member in members]
        archive.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return path


BNB_WHEEL = "bitsandbytes-0.45.0-py3-none-manylinux_2_24_x86_64.whl"
BNB_RECORD = "bitsandbytes-0.45.0.dist-info/RECORD"


def _record_paths(archive: zipfile.ZipFile, record: str) -> list[str]:
    return [line.split(",")[0] for line in archive.read(record).decode().splitlines() if line]


def test_trim_keeps_the_node_cuda_libraries_and_drops_the_others(tmp_path):
    members = [
        "bitsandbytes/__init__.py",
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda118.so",
        "bitsandbytes/libbitsandbytes_cuda124.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda131_nocublaslt.so",
    ]
    wheel = _wheel(tmp_path / "src", BNB_WHEEL, members)
    dest = tmp_path / "out"
    dest.mkdir()

    copy, dropped = trim_cuda_libraries(wheel, "13.0", dest)

    assert copy == dest / BNB_WHEEL
    assert dropped == ["bitsandbytes/libbitsandbytes_cuda118.so", "bitsandbytes/libbitsandbytes_cuda124.so"]
    kept = [
        "bitsandbytes/__init__.py",
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes/libbitsandbytes_cuda131_nocublaslt.so",
    ]
    with zipfile.ZipFile(copy) as archive:
        assert archive.testzip() is None
        assert archive.namelist() == [*kept, BNB_RECORD]
        assert archive.read("bitsandbytes/libbitsandbytes_cuda130.so") == b"bitsandbytes/libbitsandbytes_cuda130.so"
        assert _record_paths(archive, BNB_RECORD) == [*kept, BNB_RECORD]
    assert list(dest.iterdir()) == [copy]  # no temporary file left behind
    with zipfile.ZipFile(wheel) as original:  # the cached original is untouched
        assert len(original.namelist()) == len(members) + 1


def test_trim_copies_other_wheels_unchanged(tmp_path):
    wheel = _wheel(
        tmp_path / "src", "accelerate-0.25.0-py3-none-any.whl", ["accelerate/__init__.py", "accelerate/libx_cuda118.so"]
    )
    dest = tmp_path / "out"
    dest.mkdir()

    copy, dropped = trim_cuda_libraries(wheel, "13.0", dest)

    assert copy == dest / wheel.name
    assert dropped == []
    assert copy.read_bytes() == wheel.read_bytes()


def test_trim_of_a_release_without_the_node_cuda_keeps_only_its_cpu_library(tmp_path):
    members = [
        "bitsandbytes/libbitsandbytes_cpu.so",
        "bitsandbytes/libbitsandbytes_cuda118.so",
        "bitsandbytes/libbitsandbytes_cuda121_nocublaslt.so",
    ]
    wheel = _wheel(tmp_path / "src", BNB_WHEEL, members)
    dest = tmp_path / "out"
    dest.mkdir()

    copy, dropped = trim_cuda_libraries(wheel, "13.0", dest)

    assert dropped == members[1:]
    with zipfile.ZipFile(copy) as archive:
        assert archive.namelist() == ["bitsandbytes/libbitsandbytes_cpu.so", BNB_RECORD]
        assert _record_paths(archive, BNB_RECORD) == ["bitsandbytes/libbitsandbytes_cpu.so", BNB_RECORD]


# --- plan_calls, day_pins ---------------------------------------------------------------------------------


def test_plan_counts_a_shared_wheel_once_and_keeps_days_in_order():
    # a and b are 6 MB each but share a 5 MB wheel: together 7 MB, within 8 MB. c (2 MB more) would make 9.
    day_wheels = {
        "2024-01-01": {"shared.whl": 5 * MB, "a.whl": 1 * MB},
        "2024-02-01": {"shared.whl": 5 * MB, "b.whl": 1 * MB},
        "2024-03-01": {"c.whl": 2 * MB},
        "2024-04-01": {"d.whl": 6 * MB},
    }
    calls = plan_calls(day_wheels, 8 * MB)

    assert [call.days for call in calls] == [["2024-01-01", "2024-02-01"], ["2024-03-01", "2024-04-01"]]
    assert calls[0].wheels == {"shared.whl": 5 * MB, "a.whl": 1 * MB, "b.whl": 1 * MB}
    assert calls[0].size == 7 * MB
    assert calls[1].size == 8 * MB


def test_plan_gives_a_day_over_the_budget_a_call_of_its_own():
    day_wheels = {
        "2024-01-01": {"a.whl": 3 * MB},
        "2024-02-01": {"huge.whl": 9 * MB},
        "2024-03-01": {"b.whl": 3 * MB},
        "2024-04-01": {"c.whl": 4 * MB},
    }
    calls = plan_calls(day_wheels, 8 * MB)

    # First fit, largest day first: huge alone; c (4) then a (3) share one call; b (3) no longer fits there.
    assert calls == [
        CallPlan(["2024-01-01", "2024-04-01"], {"c.whl": 4 * MB, "a.whl": 3 * MB}),
        CallPlan(["2024-02-01"], {"huge.whl": 9 * MB}),
        CallPlan(["2024-03-01"], {"b.whl": 3 * MB}),
    ]
    planned = sorted(day for call in calls for day in call.days)
    assert planned == list(day_wheels)  # every day in exactly one call
    assert [call.size > 8 * MB for call in calls] == [False, True, False]


def test_plan_of_no_days_is_no_calls():
    assert plan_calls({}, 8 * MB) == []


LOCK = {
    "days": {
        "2023-01-15": {"error": "no stack of 2023-01-15 resolves over the node's torch 2.11.0+cu130: why"},
        "2024-01-15": {
            "resolved": {"transformers": "4.36.2", "numpy": "1.26.4"},
            "overlay": {"numpy": "1.26.4", "transformers": "4.36.2"},
            "overlay_reasons": [],
        },
    }
}


def test_day_pins_gives_overlay_lines_and_none_for_a_day_without_a_stack():
    assert day_pins(LOCK, ["2024-01-15", "2023-01-15"]) == {
        "2024-01-15": ["numpy==1.26.4", "transformers==4.36.2"],
        "2023-01-15": [],
    }


def test_day_pins_refuses_a_day_the_lock_lacks():
    with pytest.raises(ValueError, match="2025-06-01") as raised:
        day_pins(LOCK, ["2024-01-15", "2025-06-01"])
    assert "2023-01-15, 2024-01-15" in str(raised.value)
