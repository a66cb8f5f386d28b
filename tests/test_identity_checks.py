"""S9's identities can fail, and hold where they must: against the float64 hand reference of
`scenarios/kit/identities.py`, in the CI cell's environment (real torch, transformers and peft), a right update lands
at the round-off floor; a mean of per-micro-batch means, an update 1% too large, an AdamW run that skipped a step
and a merged weight without its scaling are each told apart, by how much they are off."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import found_in_ci_env

SCRIPT = textwrap.dedent(
    """
    import copy, json, torch
    from scenarios.kit import identities

    config = {"adapter": "lora", "targets": "qv", "r": 8, "alpha": 8, "data_seed": 1}
    rows = identities.rows(config)
    model = identities.build_model(config)
    reference = identities.sgd_reference(model, rows, 0.0, "float64")
    rounded = identities.sgd_reference(model, rows, 0.0, "float32")
    found = {}

    def sgd_update(batches):
        work = copy.deepcopy(model)
        before = identities.trainable(work)
        params = [p for p in work.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=identities.SGD_LR)
        for part in batches:  # each part's own mean loss, averaged: the mean of means
            (work(**identities.stacked(part)).loss / len(batches)).backward()
        optimizer.step()
        return identities.difference(identities.trainable(work), before)

    right = sgd_update([rows])
    found["right"] = identities.compare(right, reference, rounded, reference)
    found["mean_of_means"] = identities.compare(sgd_update([rows[:2], rows[2:]]), reference, rounded, reference)
    found["one_percent"] = identities.compare({k: v * 1.01 for k, v in right.items()}, reference, rounded, reference)

    steps, lr = 4, 1e-2
    start = identities.trainable(model)
    adam = identities.adamw_reference(model, rows, steps, lr, "float64")
    adam32 = identities.adamw_reference(model, rows, steps, lr, "float32")
    change = {k: adam[k] - start[k].double() for k in adam}

    def adamw_run(skip):
        work = copy.deepcopy(model)
        params = [p for p in work.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: (steps - t) / steps)
        every = identities.stacked(rows)
        for t in range(steps):
            optimizer.zero_grad()
            work(**every).loss.backward()
            if t != skip:
                optimizer.step()
            schedule.step()
        return identities.trainable(work)

    found["adamw"] = identities.compare(adamw_run(None), adam, adam32, change)
    found["adamw_skipped_step"] = identities.compare(adamw_run(2), adam, adam32, change)
    found = {k: {**v, "holds": identities.holds(v)} for k, v in found.items()}
    print("FOUND " + json.dumps(found))
    """
)


@pytest.mark.matrix
def test_identities_hold_at_the_floor_and_fail_by_their_size(tmp_path: Path) -> None:
    found = found_in_ci_env(SCRIPT, tmp_path)
    for right in ("right", "adamw"):
        assert found[right]["holds"], found[right]
        # At the round-off floor, far below the update: the tolerance is not what lets it pass.
        assert found[right]["discrepancy"] <= 4 * found[right]["floor"], found[right]
        assert found[right]["floor"] < 1e-4 * found[right]["update_scale"], found[right]
    # Rows of 15, 3, 9 and 1 predicted tokens, halves averaged: off by a large part of the update.
    assert not found["mean_of_means"]["holds"] and found["mean_of_means"]["off_by"] > 0.1, found["mean_of_means"]
    # 1% too large is 1% of the update off, thousands of floors: told apart.
    assert not found["one_percent"]["holds"], found["one_percent"]
    assert 0.009 < found["one_percent"]["off_by"] < 0.011, found["one_percent"]
    assert not found["adamw_skipped_step"]["holds"] and found["adamw_skipped_step"]["off_by"] > 0.05


QLORA_MERGE = textwrap.dedent(
    """
    import json
    from scenarios import compat
    from scenarios import s9_identity_merge as merge

    config = merge.strategies.seed_config(merge.SEED, adapter="qlora")
    found = {}
    for variant in ("baseline", "reload_then_merge"):
        try:
            found[variant] = {"outcome": "pass", **merge.run(config, variant, {"device": "cpu"})["metrics"]}
        except compat.CheckFailed as exc:
            found[variant] = {"outcome": exc.check, **exc.metrics}
        except compat.NotApplicable as exc:
            found[variant] = {"outcome": "not applicable", "why": str(exc)}
    print("FOUND " + json.dumps(found))
    """
)


@pytest.mark.matrix
def test_a_qlora_merge_is_checked_against_the_same_requantization_by_hand(tmp_path: Path) -> None:
    """Merging into 4-bit weights requantizes them (a loss by design, recorded); the merged model must compute what
    that requantization by hand computes. Where bitsandbytes packed the weights for its CPU kernels before the merge,
    peft's merge dequantizes the packed data and the merged model is off by most of the adapter's effect; a base
    loaded afresh with the saved adapter merges right."""
    found = found_in_ci_env(QLORA_MERGE, tmp_path)
    base, reload = found["baseline"], found["reload_then_merge"]
    assert reload["outcome"] == "pass", reload
    assert reload["discrepancy"] <= 4 * reload["floor"] and not reload["packed_for_cpu_at_merge"], reload
    design = reload["requantization_by_design"]
    assert 0.005 < design["off_by"] < 0.5 and design["discrepancy"] > 4 * design["floor"], design  # real, measured loss
    if base["packed_for_cpu_at_merge"]:
        assert base["outcome"] == "identity-merge" and base["off_by"] > 0.3, base
    else:
        assert base["outcome"] == "pass" and base["discrepancy"] <= 4 * base["floor"], base
