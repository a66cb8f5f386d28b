"""Signature normalisation: real upstream error texts map to stable names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harness.recording.signatures import classify, exception_signature, normalise_message

# Shapes of the real messages (torch.utils.checkpoint, OpenRLHF#569, peft#1910, peft#1577).
DTYPE_MISMATCH = (
    "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during the "
    "forward pass.\ntensor at position 12:\nsaved metadata: {'shape': torch.Size([512]), 'dtype': torch.float32, "
    "'device': device(type='cuda', index=0)}\nrecomputed metadata: {'shape': torch.Size([512]), 'dtype': "
    "torch.bfloat16, 'device': device(type='cuda', index=0)}\n"
)
SHAPE_ZERO = (
    "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during the "
    "forward pass.\ntensor at position 4:\nsaved metadata: {'shape': torch.Size([3584]), 'dtype': torch.bfloat16, "
    "'device': device(type='cuda', index=0)}\nrecomputed metadata: {'shape': torch.Size([0]), 'dtype': "
    "torch.bfloat16, 'device': device(type='cuda', index=0)}\n"
)
ELEMENT_0 = "element 0 of tensors does not require grad and does not have a grad_fn"
CKPT = "torch.utils.checkpoint.CheckpointError"


def test_checkpoint_dtype_mismatch() -> None:
    assert exception_signature(CKPT, DTYPE_MISMATCH) == "checkpoint-recompute-dtype[float32->bfloat16]"


def test_checkpoint_shape_zero() -> None:
    assert exception_signature(CKPT, SHAPE_ZERO) == "checkpoint-recompute-shape[0]"


def test_element_0() -> None:
    assert exception_signature("builtins.RuntimeError", ELEMENT_0) == "no-grad-element-0"


def test_known_issues_attached() -> None:
    verdict = classify("exception", {"exc_type": CKPT, "message": SHAPE_ZERO})
    assert verdict.outcome == "fail"
    assert "OpenRLHF/OpenRLHF#569" in verdict.known_issue
    verdict = classify("exception", {"exc_type": CKPT, "message": DTYPE_MISMATCH})
    assert "huggingface/peft#1910" in verdict.known_issue


def test_unknown_failure_is_kept_and_marked() -> None:
    verdict = classify("exception", {"exc_type": "builtins.ValueError", "message": "something new at 0x7f12 (42)"})
    assert verdict.outcome == "fail" and verdict.signature.startswith("unclassified-ValueError-")
    assert verdict.classified is False


def test_bug_in_scenario_code_is_error_not_fail(repo_root) -> None:
    detail = {"exc_type": "builtins.NameError", "message": "x", "origin": f"{repo_root}/scenarios/s9_x.py"}
    assert classify("exception", detail, repo_root=str(repo_root)).outcome == "error"
    detail["origin"] = "/venv/lib/python3.11/site-packages/peft/tuners/lora/layer.py"
    assert classify("exception", detail, repo_root=str(repo_root)).outcome == "fail"


def test_launcher_statuses() -> None:
    assert classify("timeout", {}).outcome == "timeout"
    crash = classify("crash", {"message": "worker exited with signal SIGSEGV during the job"})
    assert (crash.outcome, crash.signature) == ("crash", "crash-SIGSEGV")
    assert classify("crash", {"stderr_tail": "MemoryError"}).signature == "crash-oom"
    assert classify("env-broken", {"exc_type": "builtins.ImportError"}).signature == "env-broken-ImportError"


@given(st.integers(0, 10**9), st.integers(0, 10**6), st.sampled_from(["/tmp/a/b.py", "/x/y"]))
def test_normalisation_ignores_volatile_parts(number: int, address: int, path: str) -> None:
    message = f"bad value {number} at {hex(address)} in {path}"
    assert normalise_message(message) == normalise_message("bad value 7 at 0x1 in /z")
    assert exception_signature("ValueError", message) == exception_signature("ValueError", "bad value 7 at 0x1 in /z")


def test_failures_found_by_the_matrix_have_names() -> None:
    assert exception_signature(
        "builtins.RuntimeError", "expected dtype float for `end` but got dtype c10::BFloat16"
    ) == ("optimizer-bf16-grad-on-fp32-param")
    message = "Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"
    assert exception_signature("builtins.ValueError", message) == "fsdp-flatten-mixed-dtype"


def test_gpu_wordings_and_traceback_matched_failures() -> None:
    """Names for failures first seen on the 4 x H200 run (NCCL and CUDA word them differently)."""
    nccl = "output tensor must have the same type as input tensor"
    assert exception_signature("builtins.TypeError", nccl) == "zero3-allgather-mixed-dtype"
    cuda = "expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16"
    assert exception_signature("builtins.RuntimeError", cuda) == "matmul-dtype-mismatch"
    trace = 'peft/tuners/lora/dora.py", line 97, in get_lora_weight\n    x_eye = torch.eye(lora_A.weight.shape[1], ...'
    assert exception_signature("builtins.IndexError", "tuple index out of range", trace) == (
        "dora-reads-sharded-lora-weight"
    )
    older = 'peft/tuners/lora/dora.py", line 74, in forward\n    x_eye = torch.eye(lora_A.weight.shape[1], ...'
    assert exception_signature("builtins.IndexError", "tuple index out of range", older) == (
        "dora-reads-sharded-lora-weight"
    )  # peft 0.12 wording: the same read, in DoraLinearLayer.forward
    device = (
        "Expected all tensors to be on the same device, but got mat2 is on cuda:0, different from other tensors on cpu"
    )
    trace = 'peft/tuners/lora/dora.py", line 74, in forward\n    lora_weight = lora_B(lora_A(x_eye)).T'
    assert exception_signature("builtins.RuntimeError", device, trace) == "dora-reads-sharded-lora-weight"
    assert exception_signature("builtins.RuntimeError", device, "").startswith("unclassified-")
    assert exception_signature("builtins.IndexError", "tuple index out of range", "").startswith("unclassified-")
    dora_init = 'peft/tuners/lora/dora.py", line 50, in update_layer\n  bitsandbytes/functional.py", line 375'
    for wording in (
        "invalid argument to getCurrentStream",
        "Attempted to call `variable.set_data(tensor)`, but `variable` and `tensor` have incompatible tensor type.",
    ):  # rank 0's and rank 1's words for one failure: whichever the launcher reports, the same name
        assert exception_signature("builtins.RuntimeError", wording, dora_init) == "dora-init-reads-4bit-weight"
        assert exception_signature("builtins.RuntimeError", wording, "").startswith("unclassified-")
    freed = "setStorage: sizes [8, 64], strides [1, 8] ... are out of bounds for storage of size 0"
    trace = 'torch/utils/checkpoint.py", line 308, in backward'
    assert exception_signature("builtins.RuntimeError", freed, trace) == "recompute-uses-freed-fsdp-param"


def test_the_harness_keeps_only_generic_names() -> None:
    """The stack's failure names live with the scenarios (scenarios/failure_names.py); the harness's module
    names only what any job can do: time out, crash, run out of memory, hit our own bug, or stay unknown."""
    from pathlib import Path

    import harness.recording.signatures

    source = Path(harness.recording.signatures.__file__).read_text()
    for specific in (
        "checkpoint-recompute",
        "no-grad-element",
        "dora",
        "fsdp-",
        "zero3",
        "matmul",
        "zip-length",
        "optimizer-bf16",
        "nn.Parameter",
    ):
        assert specific not in source, specific


# --- hangs named by where their ranks wait, and the two failures first met at two ranks on 2 x H200 (issue 44) ---

HANG_RUN = "results/runs/gpu-history-ws2-20261126T151133Z-fc9f/records.jsonl"


def _hang_records() -> dict[str, dict]:
    from pathlib import Path

    from harness.recording.records import read_records

    records = read_records(Path(__file__).resolve().parents[1] / HANG_RUN)
    return {r["config_id"][:8]: r for r in records if r["outcome"] == "timeout"}


def test_committed_hangs_are_named_by_their_place() -> None:
    """The S8 hangs of 2026-11-25 (one run alone on the node): the reported one in the Trainer's token-count
    gather, and two others that one count must not mix with it."""
    from harness.recording.signatures import rename

    hangs = _hang_records()
    assert rename(hangs["d49059e5"])["signature"] == "timeout-in-token-count-gather"
    assert rename(hangs["b34d2671"])["signature"] == "timeout-in-token-count-gather"
    assert rename(hangs["13590812"])["signature"] == "timeout-in-process-group-init"
    assert rename(hangs["34ab72bc"])["signature"] == "timeout-in-wrap-weight-broadcast"
    assert rename(hangs["d49059e5"])["signature_at_run"] == "timeout"


def test_a_hang_whose_ranks_disagree_stays_unplaced() -> None:
    from harness.recording.signatures import timeout_signature

    hangs = _hang_records()
    gather, init = hangs["d49059e5"]["rank_stacks"]["0"], hangs["13590812"]["rank_stacks"]["1"]
    assert timeout_signature({"0": gather, "1": init}) == "timeout"
    assert timeout_signature({"0": gather, "1": ""}) == "timeout-in-token-count-gather"  # rank 1 printed nothing
    assert timeout_signature({}) == "timeout"
    assert classify("timeout", {"rank_stacks": {"0": gather}}).signature == "timeout-in-token-count-gather"


def test_weights_on_another_gpu_refused_by_fsdp() -> None:
    message = "Inconsistent compute device and `device_id` on rank 1: cuda:0 vs cuda:1"
    assert exception_signature("builtins.ValueError", message) == "fsdp-weights-on-another-device"


def test_forward_reads_a_freed_flat_parameter() -> None:
    frames = 'File "modeling_llama.py", line 405, in forward\n    inputs_embeds = self.embed_tokens(input_ids)\n'
    for message in (
        "The tensor has a non-zero number of elements, but its data is not allocated yet.",
        "setStorage: sizes [32, 64], strides [0, 1], storage offset 0, and itemsize 2 requiring a storage size of "
        "128 are out of bounds for storage of size 0",
        "'weight' must be 2-D",  # use_orig_params=True: the weight is FSDP1's size-0 placeholder
    ):
        verdict = classify("exception", {"exc_type": "builtins.RuntimeError", "message": message, "traceback": frames})
        assert verdict.signature == "forward-reads-freed-fsdp-param"
    # The same shape refusal outside the embedding's first read is another failure.
    elsewhere = 'File "model.py", line 9, in forward\n    return F.embedding(ids, table)\n'
    other = {"exc_type": "builtins.RuntimeError", "message": "'weight' must be 2-D", "traceback": elsewhere}
    assert classify("exception", other).signature != "forward-reads-freed-fsdp-param"
    # ZeRO-3 reading a weight it never gathered words it the same, through deepspeed's forward hooks.
    zero3 = 'File "deepspeed/runtime/zero/parameter_offload.py", line 9, in _pre_forward_module_hook\n' + frames
    ungathered = {"exc_type": "builtins.RuntimeError", "message": "'weight' must be 2-D", "traceback": zero3}
    assert classify("exception", ungathered).signature != "forward-reads-freed-fsdp-param"
