"""Release rules in profiles: parsed strictly, resolved against a wheelhouse (offline) or the index, and a
resumed run reuses the versions its meta recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness.define.profile import load_profile, parse_rule
from harness.errors import ProfileError
from harness.versions.releases import apply_rule, releases, resolve_axes
from tests.conftest import write_profile

VERSIONS = [Version(v) for v in ["4.40.0", "4.40.2", "4.41.0", "4.41.2", "4.42.4", "4.43.1", "5.0.0"]]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("latest 2", ["4.43.1", "5.0.0"]),
        (">=4.40,<5", ["4.40.0", "4.40.2", "4.41.0", "4.41.2", "4.42.4", "4.43.1"]),
        (">=4.40,<5 newest-patch", ["4.40.2", "4.41.2", "4.42.4", "4.43.1"]),
        ("latest 3 newest-patch", ["4.42.4", "4.43.1", "5.0.0"]),
    ],
)
def test_rules_select_releases(rule: str, expected: list[str]) -> None:
    assert [str(v) for v in apply_rule(VERSIONS, parse_rule("p.toml", "axes.transformers", rule))] == expected


@pytest.mark.parametrize("bad", ["latest", "latest zero", "newest", ">>4"])
def test_a_bad_rule_names_the_key(bad: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_rule("p.toml", "axes.transformers", bad)
    assert caught.value.key == "axes.transformers"


def test_rules_resolve_offline_from_a_wheelhouse_and_resume_keeps_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ["0.19.2", "0.19.3", "0.19.8", "0.20.0rc1"]:
        (wheels / f"deepspeed-{version}-py3-none-any.whl").write_bytes(b"")
    (wheels / "deepspeed-0.18.9.tar.gz").write_bytes(b"")
    assert [str(v) for v in releases("deepspeed", "3.11", wheels)] == ["0.18.9", "0.19.2", "0.19.3", "0.19.8"]
    text = '[profile]\ndevice = "cpu"\n[axes]\ntorch = ["2.13.0"]\ndeepspeed = "latest 2"\n'
    profile = load_profile(str(write_profile(tmp_path, text)), tmp_path)
    resolved_profile, resolved = resolve_axes(profile, wheels)
    assert resolved == {"deepspeed": ["0.19.3", "0.19.8"]}
    assert resolved_profile.axes["deepspeed"] == ("0.19.3", "0.19.8")
    # A resumed run reuses its recorded versions even if the wheelhouse (or index) changed since.
    again, kept = resolve_axes(profile, wheels, recorded={"deepspeed": ["0.19.2", "0.19.3"]})
    assert kept == {"deepspeed": ["0.19.2", "0.19.3"]} and again.axes["deepspeed"] == ("0.19.2", "0.19.3")
