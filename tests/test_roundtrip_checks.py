"""S10's legs can fail, and hold where they must, in the CI cell's environment (real torch and peft): the seed config's
round trip lands at the round-off floor with every key where it was saved, and merged then unmerged gives the base
back; an unmerge that leaves the adapter in the weights is off by the adapter's whole effect; a load that leaves one
saved tensor at its fresh value is off by a large part of the adapter's effect and names that key; a file that also
holds another adapter's tensor under a mangled name fails on the keys while its logits agree; a file whose key names
a module the model lacks fails the save leg."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import found_in_ci_env

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, torch
    from safetensors.torch import load_file, save_file
    from scenarios import compat
    from scenarios import s10_adapter_roundtrip as s10
    from scenarios.kit import identities, roundtrip

    config = s10.normalized(s10.SEED)

    def outcome(body):
        try:
            return {"outcome": "pass", **body()["metrics"]}
        except compat.CheckFailed as exc:
            return {"outcome": exc.check, "message": str(exc), **exc.metrics}

    def loaded_by_hand(root, spoil=None, unmerge_kept_adapter=False):
        # The load as the scenario's fresh process does it, here, with one loaded tensor put back to zero.
        batch = identities.tensors_from_file(os.path.join(os.path.dirname(root), "batch.pt"))
        model, _ = roundtrip._load_adapters(config, root)
        model.eval()
        tensors = roundtrip.adapter_tensors(model, "default")
        if spoil:
            name = next(n for n in tensors if spoil in n)
            with torch.no_grad():
                tensors[name].zero_()
        with torch.no_grad():
            logits = {"default": model(input_ids=batch["input_ids"]).logits}
        out = os.path.join(os.path.dirname(root), "spoilt")
        os.makedirs(out, exist_ok=True)
        return {"logits": identities.tensors_to_file(logits, os.path.join(out, "l.pt")),
                "tensors": identities.tensors_to_file({f"default|{n}": t for n, t in tensors.items()},
                                                      os.path.join(out, "t.pt")),
                "merged": identities.tensors_to_file({}, os.path.join(out, "m.pt")), "said": [],
                # an unmerge that leaves the adapter in the weights: the "base" it gives back is the adapted model
                "unmerged": identities.tensors_to_file(logits if unmerge_kept_adapter else {},
                                                       os.path.join(out, "u.pt"))}

    def main(work):  # the fresh load process is spawned: it re-imports this file, which must not run again
        found = {}
        ctx = {"workdir": os.path.join(work, "seed"), "device": "cpu"}
        found["seed"] = outcome(lambda: s10.run(config, "baseline", ctx))
        root = os.path.join(ctx["workdir"], "saved")
        found["kept"] = outcome(lambda: s10.judge(config, root, loaded_by_hand(root, unmerge_kept_adapter=True)))
        found["dropped"] = outcome(lambda: s10.judge(config, root, loaded_by_hand(root, "layers.1.v.lora_B")))

        adapter_file = os.path.join(root, "adapter_model.safetensors")
        tensors = load_file(adapter_file)
        key = next(k for k in tensors if k.endswith("layers.0.q.lora_A.weight"))
        save_file({**tensors, key.replace(".q.", ".q_other."): tensors[key].clone() + 1.0}, adapter_file)
        found["foreign"] = outcome(lambda: s10.judge(config, root, loaded_by_hand(root)))
        save_file({(k.replace(".q.", ".qq.") if k == key else k): v for k, v in tensors.items()}, adapter_file)
        found["renamed"] = outcome(lambda: s10.judge(config, root, loaded_by_hand(root)))
        print("FOUND " + json.dumps(found, default=str))

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.matrix
def test_roundtrip_legs_hold_at_the_floor_and_name_what_went_wrong(tmp_path: Path) -> None:
    found = found_in_ci_env(SCRIPT, tmp_path, str(tmp_path))
    seed = found["seed"]
    assert seed["outcome"] == "pass", seed
    legs = seed["default"]
    for leg in ("save", "load", "merge", "unmerge"):
        # at the round-off floor, far below what the adapter changes: the tolerance is not what lets it pass
        assert legs[leg]["discrepancy"] <= 4 * legs[leg]["floor"] and legs[leg]["off_by"] < 1e-4, (leg, legs[leg])
    assert not any(legs["keys"].values()), legs["keys"]
    kept = found["kept"]  # the adapter left in the weights after the unmerge: off by the whole of its effect
    assert kept["outcome"] == "roundtrip-unmerge" and 0.99 < kept["off_by"] < 1.01, kept
    assert "base it should give back" in kept["message"], kept
    dropped = found["dropped"]
    assert dropped["outcome"] == "roundtrip-load" and dropped["off_by"] > 0.01, dropped
    assert any("layers.1.v.lora_B" in k for k in dropped["default"]["keys"]["not_from_file"]), dropped
    assert any("layers.1.v.lora_B" in k for k in dropped["default"]["keys"]["dropped"]), dropped
    foreign = found["foreign"]
    assert foreign["outcome"] == "roundtrip-keys", foreign
    assert any(".q_other." in k and "nothing trained" in k for k in foreign["default"]["keys"]["foreign"]), foreign
    renamed = found["renamed"]
    assert renamed["outcome"] == "roundtrip-save" and renamed["off_by"] > 0.01, renamed
    assert any(".qq" in m for m in renamed["default"]["file_names_modules_not_in_model"]), renamed


LAYOUTS = textwrap.dedent(
    """
    import json, os, sys, torch
    from scenarios import compat
    from scenarios import s10_adapter_roundtrip as s10
    from scenarios.kit import identities, roundtrip

    def main(work):  # the fresh load process re-imports this file: only main runs the configs
        found = {}
        for label, changes in (("heads", {"heads": ["score", "score_1", "score_10"]}),
                               ("weight_target", {"names": {**s10.named_models.PLAIN, "v": "weight"}}),
                               ("prefix_adapters", {"adapters": ["default", "default_1"]})):
            config = s10.normalized({**s10.SEED, **changes})
            ctx = {"workdir": os.path.join(work, label), "device": "cpu"}
            try:
                metrics = s10.run(config, "baseline", ctx)["metrics"]
                outcome = "pass"
            except compat.CheckFailed as exc:
                outcome, metrics = exc.check, exc.metrics
            root = os.path.join(ctx["workdir"], "saved")
            parts, _, _ = roundtrip.saved_parts(root, config["adapters"][0])
            kept = json.load(open(os.path.join(root, "roundtrip.json")))["adapters"][config["adapters"][0]]
            found[label] = {"outcome": outcome, "off_by": metrics.get("off_by"),
                            "heads_saved": sorted(p for p, v in parts.items() if "own_weight" in v),
                            "adapted": sorted(kept["scalings"]), "adapters": config["adapters"],
                            "modules_to_save": config["modules_to_save"]}
        print("FOUND " + json.dumps(found, default=str))

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.matrix
def test_the_drawn_layouts_are_what_they_say(tmp_path: Path) -> None:
    """S10's new layouts reach what they name, in a real round trip: three modules_to_save heads whose names are
    prefixes of each other are each saved whole, a LoRA target named `weight` is adapted (peft writes
    `layers.0.weight.lora_A...`), and adapters `default` and `default_1` are both saved; each holds at the floor on
    the CI cell's peft (a pass that is not a round trip of these layouts would prove nothing about them)."""
    found = found_in_ci_env(LAYOUTS, tmp_path, str(tmp_path))
    heads = found["heads"]
    assert heads["modules_to_save"] and heads["heads_saved"] == ["score", "score_1", "score_10"], heads
    target = found["weight_target"]
    assert {"layers.0.weight", "layers.1.weight"} <= set(target["adapted"]), target
    assert found["prefix_adapters"]["adapters"] == ["default", "default_1"]
    for label, one in found.items():
        assert one["outcome"] == "pass" and one["off_by"] < 1e-4, (label, one)
