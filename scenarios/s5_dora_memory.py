"""S5: DoRA memory (fp32 upcast) compared with LoRA on the same config.

Each run builds the same tiny Llama twice, once with LoRA and once with DoRA (same rank, alpha, targets,
PEFT kwargs), and measures one forward+backward of each:

* CPU: a ``TorchDispatchMode`` tally over every op: bytes of new output storages (``alloc_bytes``), the
  peak of the bytes still alive (``peak_bytes``, tracked with ``weakref.finalize`` on the storages; it
  counts only tensors created during the measured step, not parameters), and the count and bytes of
  float32 storages produced (``fp32_*``); the fp32 bytes produced inside DoRA's forward are counted apart
  (``dora_fwd_fp32_bytes``).
* CUDA: ``torch.cuda.max_memory_allocated`` around forward+backward (``peak_bytes``, over the memory
  allocated before the step), plus the same tally for the fp32 counts.
* Step time: median of a few untallied forward+backward+AdamW steps.

It also records, for every DoRA call, the dtype of the activation entering the PEFT LoRA layer, the dtype
of the ``x`` that reaches DoRA (PEFT casts ``x`` to the adapter dtype first, which is float32 by default
since ``autocast_adapter_dtype=True``), and the dtype DoRA returns.

Check ``dora_layer_output_dtype`` (what users see): every DoRA layer hands the next layer the dtype its frozen
base layer alone returns. DoRA's own fp32 arithmetic inside the layer is by design since peft 0.12 (the
layer casts its result back) and stays a metric (``dora_internal_fp32_calls``, ``dora_dtypes``, the fp32
bytes). CheckFailed otherwise, with all metrics attached: the target, e.g. QDoRA under autocast, where the
cast back is skipped and fp32 leaks into the next layer.

Variants:
* ``cast_result_to_input_dtype``: the seed's / peft#1692 reporter's fix ``return result_dora.to(x.dtype)``,
  patched for the run into ``peft.tuners.lora.dora.DoraLinearLayer.forward`` (peft >= 0.11) or
  ``LoraLayer._apply_dora`` (older). ``x`` is DoRA's own argument, as in the reporter's patch.
* ``autocast_adapter_dtype_false``: ``get_peft_model(..., autocast_adapter_dtype=False)`` (peft >= 0.12), for
  both the LoRA and the DoRA model, so the adapters stay in the model dtype.

``config["base"]``: ``"frozen-base"`` (dense model in ``dtype``), ``"4bit"`` (QDoRA: bnb nf4 via
``from_pretrained``; falls back to ``frozen-base`` where the stack refuses 4-bit on this device or
bitsandbytes is not installed, recorded in ``path`` and ``metrics["fallback_reason"]``) or ``"manual-4bit"``
(see ``s2_qlora_grad_flags``).
"""

from __future__ import annotations

import inspect
import statistics
import time

from scenarios import compat
from scenarios.kit import measured, qlora
from scenarios.kit.adapters import ALL_LINEAR, lora_config, trainable_dtypes
from scenarios.kit.models import save_pretrained_tiny

SPEC = {
    "id": "S5-dora-memory",
    "title": "DoRA uses more memory than LoRA (fp32 upcast of the DoRA path)",
    "known_issues": [
        "huggingface/peft#1692",
        "huggingface/peft#1857",
        "huggingface/peft#2122",
        "huggingface/peft#2661",
    ],
    "world_size": 1,
    "setup": {"adapter": "dora"},
    "device": "any",
    "requires": ["torch", "transformers", "peft"],
    # Every variant is a measurement (not a fix), so drawn configs run them all, failing or not.
    "drawn_variants": "all",
    # fp32 leaking out of a DoRA layer into the next one (what users see); memory is measured on every run.
    "target": ["check-dora_layer_output_dtype"],
    "controls": [],
    "variants": {
        "baseline": ("baseline", "the config as drawn: what a user of this stack writes by default"),
        "cast_result_to_input_dtype": ("fix", "the seed's local patch: DoRA's result cast to x.dtype"),
        "autocast_adapter_dtype_false": ("fix", "get_peft_model(..., autocast_adapter_dtype=False)"),
    },
    "table_metrics": ["dora_lora_peak_ratio", "dora_peak_bytes", "lora_peak_bytes"],
}

FIXES = ("cast_result_to_input_dtype", "autocast_adapter_dtype_false")

_BASE = {
    "dtype": "bfloat16",
    "hidden": 256,
    "layers": 2,
    "vocab": 256,
    "rank": 16,
    "alpha": 32,
    "targets": ALL_LINEAR,
    "batch": 4,
    "seq": 64,
    "autocast": False,
    "seed": 0,
    "timing_steps": 3,
}

EXAMPLES: list[dict] = [
    # the peft#1692 shape: every linear layer, bf16
    dict(_BASE, base="frozen-base"),
    # QDoRA: nf4 base, bf16 compute (falls back to frozen-base where 4-bit cannot load)
    dict(_BASE, base="4bit"),
    # HF Trainer(bf16=True) runs the forward under autocast
    dict(_BASE, base="frozen-base", autocast=True),
    dict(_BASE, base="4bit", autocast=True),
]


def strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {
            "base": st.sampled_from(["frozen-base", "4bit"]),
            "dtype": st.sampled_from(["bfloat16", "float16", "float32"]),
            "hidden": st.sampled_from([128, 256]),
            "layers": st.integers(1, 2),
            "vocab": st.sampled_from([128, 256]),
            "rank": st.sampled_from([4, 8, 16, 32]),
            "alpha": st.sampled_from([8, 16, 32, 64]),
            "targets": st.sampled_from([["q_proj", "v_proj"], ALL_LINEAR]),
            "batch": st.integers(1, 4),
            "seq": st.sampled_from([16, 32, 64]),
            "autocast": st.booleans(),
            "seed": st.integers(0, 2**16),
            "timing_steps": st.just(3),
        }
    )


# --------------------------------------------------------------------------------------------------
# measurement


_TALLY_CLS = None


def _tally_cls():
    """A TorchDispatchMode that tallies the storages ops produce (built lazily: imports torch)."""
    global _TALLY_CLS
    if _TALLY_CLS is not None:
        return _TALLY_CLS
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Tally(TorchDispatchMode):
        def __init__(self, probe):
            super().__init__()
            self.probe = probe  # probe["in_dora"] > 0 while DoRA's forward runs
            self.alloc = self.live = self.peak = 0
            self.fp32_count = self.fp32_bytes = self.dora_fp32_bytes = self.dora_alloc = 0
            self.live_keys = {}

        def _free(self, key, nbytes):
            if self.live_keys.pop(key, None) is not None:
                self.live -= nbytes

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                try:
                    storage = t.untyped_storage()
                except Exception:
                    continue
                key = id(storage)
                if key in self.live_keys:  # a view or an in-place result: not a new allocation
                    continue
                nbytes = storage.nbytes()
                self.live_keys[key] = weakref.finalize(storage, self._free, key, nbytes)
                self.alloc += nbytes
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                in_dora = self.probe["in_dora"] > 0
                if in_dora:
                    self.dora_alloc += nbytes
                if t.dtype == torch.float32:
                    self.fp32_count += 1
                    self.fp32_bytes += nbytes
                    if in_dora:
                        self.dora_fp32_bytes += nbytes
            return out

        def __exit__(self, *exc):
            result = super().__exit__(*exc)
            for fin in list(self.live_keys.values()):
                fin.detach()
            self.live_keys.clear()
            return result

    _TALLY_CLS = Tally
    return Tally


def _dora_targets():
    """(owner, attribute) of the function that computes DoRA's output in this peft release."""
    try:
        from peft.tuners.lora.dora import DoraLinearLayer

        return DoraLinearLayer, "forward"
    except ImportError:
        from peft.tuners.lora.layer import LoraLayer

        if hasattr(LoraLayer, "_apply_dora"):
            return LoraLayer, "_apply_dora"
        raise


class _DoraProbe:
    """Patch DoRA's forward for one run: record dtypes, flag DoRA ops for the tally, optionally cast."""

    def __init__(self, cast: bool):
        self.cast = cast
        self.state = {"in_dora": 0}
        self.calls: list[tuple[str, str, str]] = []  # (layer input dtype, dora x dtype, dora output dtype)
        self.outer: list = []  # input dtypes of the LoRA layers being run
        # What users see, per call of a DoRA layer: (input dtype, dtype the frozen layer alone returns, dtype the
        # DoRA layer returns, i.e. what the next layer receives).
        self.layers: list[tuple[str, str, str]] = []
        self._stack: list[list] = []
        self.owner, self.attr = _dora_targets()
        self.original = None
        self.handles = []

    @property
    def patched_name(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.attr}"

    def __enter__(self):
        original = self.owner.__dict__[self.attr]
        self.original = original
        probe = self

        def patched(module_self, x, *args, **kwargs):
            probe.state["in_dora"] += 1
            try:
                result = original(module_self, x, *args, **kwargs)
                if probe.cast:
                    result = result.to(x.dtype)  # the seed's fix: `return result_dora.to(x.dtype)`
            finally:
                probe.state["in_dora"] -= 1
            outer = probe.outer[-1] if probe.outer else None
            probe.calls.append((str(outer), str(x.dtype), str(result.dtype)))
            return result

        setattr(self.owner, self.attr, patched)
        return self

    def watch(self, model) -> int:
        """Hook the PEFT LoRA layers that use DoRA, to know the dtype entering them."""
        n = 0
        for module in model.modules():
            use_dora = getattr(module, "use_dora", None)
            if not (isinstance(use_dora, dict) and any(use_dora.values())):
                continue
            self.handles.append(module.register_forward_pre_hook(self._push))
            self.handles.append(module.register_forward_hook(self._pop))
            base = getattr(module, "base_layer", None)
            if base is not None:
                self.handles.append(base.register_forward_hook(self._base_done))
            n += 1
        return n

    def _push(self, module, args):
        x = args[0] if args else None
        self.outer.append(getattr(x, "dtype", None))
        self._stack.append([getattr(x, "dtype", None), None])

    def _base_done(self, module, args, output):
        if self._stack and self._stack[-1][1] is None:
            self._stack[-1][1] = getattr(output, "dtype", None)

    def _pop(self, module, args, output):
        if self.outer:
            self.outer.pop()
        if self._stack:
            layer_in, base_out = self._stack.pop()
            self.layers.append((str(layer_in), str(base_out), str(getattr(output, "dtype", None))))

    def __exit__(self, *exc):
        setattr(self.owner, self.attr, self.original)
        for handle in self.handles:
            handle.remove()
        return False


def _build(config: dict, device: str, use_dora: bool, fixes: set[str], directory: str):
    import torch
    from peft import get_peft_model

    torch.manual_seed(config["seed"])
    model, path, info = qlora.load_base(config, directory, device, config.get("base", "frozen-base"))
    model.train()
    lora = lora_config(config["rank"], config["alpha"], list(config["targets"]), use_dora=use_dora)
    kwargs = {"autocast_adapter_dtype": False} if "autocast_adapter_dtype_false" in fixes else {}
    if kwargs and "autocast_adapter_dtype" not in inspect.signature(get_peft_model).parameters:
        raise compat.NotApplicable("get_peft_model has no autocast_adapter_dtype before peft 0.12")
    peft_model = get_peft_model(model, lora, **kwargs)
    peft_model.train()
    info["adapter_dtypes"] = ",".join(trainable_dtypes(peft_model))
    return peft_model, path, info


def _measure(model, config: dict, device: str, probe_state: dict) -> dict:
    import contextlib

    import torch

    gen = torch.Generator().manual_seed(config["seed"] + 1)
    ids = torch.randint(0, config["vocab"], (config["batch"], config["seq"]), generator=gen).to(device)
    dtype = compat.torch_dtype(config["dtype"])
    use_autocast = bool(config.get("autocast")) and dtype != torch.float32

    def autocast():
        if use_autocast:
            return torch.autocast(device_type=device, dtype=dtype)
        return contextlib.nullcontext()

    def fwd_bwd():
        with autocast():
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach()

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    fwd_bwd()  # warm-up (lazy inits, kernel loading)
    model.zero_grad(set_to_none=True)

    metrics: dict = {}
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fwd_bwd()
        torch.cuda.synchronize()
        metrics["peak_bytes"] = torch.cuda.max_memory_allocated() - before
        metrics["memory_source"] = "torch.cuda.max_memory_allocated"
        model.zero_grad(set_to_none=True)

    tally = _tally_cls()(probe_state)
    with tally:
        loss = fwd_bwd()
    model.zero_grad(set_to_none=True)
    metrics.update(
        {
            "alloc_bytes": tally.alloc,
            "fp32_count": tally.fp32_count,
            "fp32_bytes": tally.fp32_bytes,
            "dora_fwd_alloc_bytes": tally.dora_alloc,
            "dora_fwd_fp32_bytes": tally.dora_fp32_bytes,
            "loss": float(loss.float()),
        }
    )
    if device != "cuda":
        metrics["peak_bytes"] = tally.peak
        metrics["memory_source"] = "dispatch-tally"

    times = []
    for _ in range(config.get("timing_steps", 3)):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd_bwd()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    metrics["step_s"] = round(statistics.median(times), 5)
    return metrics


def run(config: dict, variant: str, ctx: dict) -> dict:
    measured.start(ctx)  # what really ran goes into the record's setup
    import tempfile

    fixes = compat.parse_variant(variant, FIXES)
    device = ctx.get("device", "cpu")
    metrics: dict = {}
    with tempfile.TemporaryDirectory(dir=ctx.get("workdir")) as directory:
        save_pretrained_tiny(config, directory)

        lora_model, path, info = _build(config, device, False, fixes, directory)
        lora = _measure(lora_model, config, device, {"in_dora": 0})
        metrics["lora_adapter_dtypes"] = info["adapter_dtypes"]
        del lora_model

        with _DoraProbe(cast="cast_result_to_input_dtype" in fixes) as probe:
            dora_model, dora_path, info = _build(config, device, True, fixes, directory)
            metrics["dora_layers"] = probe.watch(dora_model)
            dora = _measure(dora_model, config, device, probe.state)
        metrics["dora_patched"] = probe.patched_name if probe.cast else None
        metrics["dora_adapter_dtypes"] = info["adapter_dtypes"]
        del dora_model

    if "fallback_reason" in info:
        metrics["fallback_reason"] = info["fallback_reason"]
    for key, value in lora.items():
        metrics[f"lora_{key}"] = value
    for key, value in dora.items():
        metrics[f"dora_{key}" if not key.startswith("dora_") else key] = value

    def ratio(a, b):
        return round(a / b, 4) if b else None

    metrics["dora_lora_peak_ratio"] = ratio(dora["peak_bytes"], lora["peak_bytes"])
    metrics["dora_lora_alloc_ratio"] = ratio(dora["alloc_bytes"], lora["alloc_bytes"])
    metrics["dora_lora_fp32_ratio"] = ratio(dora["fp32_bytes"], lora["fp32_bytes"])
    metrics["dora_extra_fp32_bytes"] = dora["fp32_bytes"] - lora["fp32_bytes"]
    metrics["dora_lora_step_time_ratio"] = ratio(dora["step_s"], lora["step_s"])

    calls = probe.calls
    metrics["dora_calls"] = len(calls)
    metrics["dora_dtypes"] = ",".join(sorted({f"in={a}|x={b}|out={c}" for a, b, c in calls})).replace("torch.", "")
    # DoRA's own arithmetic in fp32 is by design (peft >= 0.12 casts the layer's result back): it stays a
    # metric. What users see is the dtype the DoRA layer hands to the next layer.
    metrics["dora_internal_fp32_calls"] = sum(1 for _, _, c in calls if c == "torch.float32")
    layers = probe.layers
    metrics["dora_layer_dtypes"] = ",".join(sorted({f"in={a}|base={b}|out={c}" for a, b, c in layers})).replace(
        "torch.", ""
    )
    if not calls or not layers:
        raise compat.CheckFailed("dora_active", "no DoRA call happened in the DoRA model", metrics=metrics)
    leaks = [(b, c) for _, b, c in layers if b != c]
    metrics["dora_layer_dtype_leaks"] = len(leaks)
    if leaks:
        base_out, out = leaks[0]
        raise compat.CheckFailed(
            "dora_layer_output_dtype",
            f"{len(leaks)}/{len(layers)} DoRA layer calls return {out} where the frozen layer returns {base_out}: "
            f"the next layer gets {out} (DoRA adds {metrics['dora_extra_fp32_bytes']} fp32 bytes over LoRA; "
            f"peak ratio {metrics['dora_lora_peak_ratio']})",
            metrics=metrics,
        )
    return {"metrics": metrics, "path": dora_path if dora_path == path else f"{path}/{dora_path}"}
