"""Every outcome a record can have, and the sets of them the harness reasons with: one place, so a verdict,
a bisect and a table never disagree about what counts as failing."""

from __future__ import annotations

OUTCOMES = ("pass", "fail", "flaky", "skip", "timeout", "crash", "env-broken", "install-failed", "error")
#: The job ran and went wrong (the stack's failure, a hang, a dead rank, or our own bug).
FAILING = frozenset({"fail", "flaky", "timeout", "crash", "error"})
#: The cell could not run the job at all: nothing is known about the scenario there.
UNUSABLE = frozenset({"install-failed", "env-broken"})
#: What counts against a cell in a verdict: a failing job, or an environment that installs but cannot import.
BAD = FAILING | {"env-broken"}
#: Outcomes whose signature names a failure of the stack (renamed with today's rules at report time).
NAMED = frozenset({"fail", "flaky"})
#: Outcomes a profile's `[retry]` may run again.
RETRYABLE = ("fail", "crash", "timeout")
#: Outcomes a table shows without a signature.
UNSIGNED = frozenset({"pass", "skip", "install-failed"})
