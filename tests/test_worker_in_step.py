"""A distributed worker restarts its group after a failure that may leave the ranks out of step, and only then:
a scenario names the failures every rank ends at one point (S7: its reload checks and its refusals)."""

from __future__ import annotations

from runtime.worker import _ends_in_step

S7 = ["check:saved_adapter_", "not-applicable"]


def test_a_named_check_or_refusal_keeps_the_group() -> None:
    assert _ends_in_step({"status": "exception", "check": "saved_adapter_empty"}, S7)
    assert _ends_in_step({"status": "exception", "exc_type": "scenarios.compat.NotApplicable"}, S7)


def test_anything_else_restarts_it() -> None:
    assert not _ends_in_step({"status": "exception", "check": "finite_loss"}, S7)  # may fail on one rank only
    assert not _ends_in_step({"status": "exception", "exc_type": "builtins.RuntimeError"}, S7)
    assert not _ends_in_step({"status": "exception", "check": "saved_adapter_empty"}, [])
    assert not _ends_in_step({"status": "exception", "exc_type": "scenarios.compat.NotApplicable"}, ["check:x"])
