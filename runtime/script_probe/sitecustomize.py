"""What a user's script really ran, measured inside its own processes: loaded by Python at start-up (this folder
is put first on the script's PYTHONPATH by `harness/execution/script_launch.py`), it changes nothing the script
does and only watches.

Each rank writes `rank-<RANK>.json` into `$COMPAT_MATRIX_SETUP_DIR`:
- the device: CUDA or CPU, how many GPUs this process sees and their names (read only where the script imported
  torch itself), the distributed backend and world size its process group really formed (read when the group is
  made, whoever makes it, and at exit);
- where the script trains through accelerate (the HF Trainer does): what each `Accelerator.prepare` resolved
  (distributed type, mixed precision, the FSDP plugin's version, state dict type and sharding strategy, the
  DeepSpeed ZeRO stage) and what really wrapped the model (FSDP1's `FullyShardedDataParallel`, FSDP2's
  `FSDPModule`, a DeepSpeed engine), and the FSDP plugin's state dict type at the time of each save.

The file is written again after every fact, so a rank that is killed (a timeout's SIGABRT) still says what it
had measured. Nothing here may raise into the script: every probe is guarded. Another `sitecustomize` later on
the path (a distribution's own) is still run.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from typing import Any

_OUT = os.environ.get("COMPAT_MATRIX_SETUP_DIR")
if os.environ.get("COMPAT_MATRIX_SETUP_RANKS_ONLY") and "RANK" not in os.environ:
    _OUT = None  # torchrun's own launcher process: only the ranks it starts are measured
_facts: dict[str, Any] = {}


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _write() -> None:
    """This rank's facts as they stand, written whole (a reader never sees half a file)."""
    if not _OUT:
        return
    try:
        # Kept from earlier writes: at exit the script may have destroyed its process group already.
        _facts["device"] = {**(_facts.get("device") or {}), **_device()}
        path = os.path.join(_OUT, f"rank-{_rank()}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(_facts, handle, default=str)
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def _device() -> dict[str, Any]:
    """CUDA or CPU as this process sees it, and its process group: read only where the script imported torch."""
    torch = sys.modules.get("torch")
    found: dict[str, Any] = {"torch_imported": torch is not None}
    if torch is None:
        return found
    try:
        cuda = bool(torch.cuda.is_available())
        found["kind"] = "cuda" if cuda else "cpu"
        if cuda:
            count = torch.cuda.device_count()
            found["gpu_count"] = count
            found["gpu_names"] = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            # 'gloo', 'nccl', or where the group was made without one ('cpu:gloo,cuda:nccl') the backends per device.
            backend = str(dist.get_backend())
            config = getattr(dist, "get_backend_config", None)
            found["backend"] = str(config()) if backend == "undefined" and config else backend
            found["world_size"] = int(dist.get_world_size())
    except Exception as exc:
        found["error"] = repr(exc)[:200]
    return found


def _name(value: Any) -> str | None:
    """An enum's name ('FULL_STATE_DICT', 'FSDP'), or the value as text."""
    if value is None:
        return None
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def _wrapped_by(model: Any) -> str | None:
    """What really wraps a prepared model: 'fsdp1', 'fsdp2', 'deepspeed', 'ddp', or None."""
    if type(model).__name__ == "DeepSpeedEngine":
        return "deepspeed"
    torch = sys.modules.get("torch")
    modules = getattr(model, "modules", None)
    if torch is None or modules is None:
        return None
    try:
        import torch.distributed.fsdp as fsdp

        every = list(modules())
        if any(isinstance(m, fsdp.FullyShardedDataParallel) for m in every):
            return "fsdp1"
        fsdp2 = getattr(fsdp, "FSDPModule", None)
        if fsdp2 is None:
            from torch.distributed._composable.fsdp import FSDPModule as fsdp2
        if any(isinstance(m, fsdp2) for m in every):
            return "fsdp2"
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return "ddp"
    except Exception:
        return None
    return None


def _plugin_facts(accelerator: Any) -> dict[str, Any]:
    state = getattr(accelerator, "state", None)
    facts: dict[str, Any] = {
        "distributed_type": _name(getattr(state, "distributed_type", None)),
        "mixed_precision": _name(getattr(state, "mixed_precision", None)),
    }
    plugin = getattr(state, "fsdp_plugin", None)
    if plugin is not None:
        facts["fsdp_plugin_version"] = getattr(plugin, "fsdp_version", 1) or 1
        facts["state_dict_type"] = _name(getattr(plugin, "state_dict_type", None))
        facts["sharding_strategy"] = _name(
            getattr(plugin, "sharding_strategy", None) or getattr(plugin, "reshard_after_forward", None)
        )
    deepspeed = getattr(state, "deepspeed_plugin", None)
    if deepspeed is not None:
        facts["zero_stage"] = getattr(deepspeed, "zero_stage", None)
    return facts


def _watch_accelerator(module: Any) -> None:
    """Wrap `Accelerator.prepare` and `get_state_dict`: note what they resolved, then return what they return."""
    accelerator_class = getattr(module, "Accelerator", None)
    if accelerator_class is None or getattr(accelerator_class, "_compat_matrix_watched", False):
        return
    prepare, get_state_dict = accelerator_class.prepare, getattr(accelerator_class, "get_state_dict", None)

    def watched_prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = prepare(self, *args, **kwargs)
        try:
            # Several objects come back as a tuple, or as a list (accelerate's FSDP2 path returns one).
            prepared = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            wrapped = [w for w in (_wrapped_by(p) for p in prepared) if w]
            entry = _plugin_facts(self) | {"wrapped_by": sorted(set(wrapped))}
            _facts.setdefault("accelerate", {}).setdefault("prepare", []).append(entry)
            _write()
        except Exception:
            pass
        return result

    def watched_get_state_dict(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            entry = {"state_dict_type": _plugin_facts(self).get("state_dict_type")}
            _facts.setdefault("accelerate", {}).setdefault("get_state_dict", []).append(entry)
            _write()
        except Exception:
            pass
        return get_state_dict(self, *args, **kwargs)

    accelerator_class.prepare = watched_prepare
    if get_state_dict is not None:
        accelerator_class.get_state_dict = watched_get_state_dict
    accelerator_class._compat_matrix_watched = True


def _watch_process_group(module: Any) -> None:
    """Wrap `init_process_group` (torch.distributed re-exports it after this module runs): note the group it made."""
    init = getattr(module, "init_process_group", None)
    if init is None or getattr(init, "_compat_matrix_watched", False):
        return

    def watched_init(*args: Any, **kwargs: Any) -> Any:
        result = init(*args, **kwargs)
        _write()
        return result

    watched_init._compat_matrix_watched = True  # type: ignore[attr-defined]
    module.init_process_group = watched_init


def _watch_deepspeed(module: Any) -> None:
    """Wrap `deepspeed.initialize` (a script that builds its engine itself, no accelerate): note the ZeRO stage the
    engine really runs."""
    initialize = getattr(module, "initialize", None)
    if initialize is None or getattr(initialize, "_compat_matrix_watched", False):
        return

    def watched_initialize(*args: Any, **kwargs: Any) -> Any:
        result = initialize(*args, **kwargs)
        try:
            engine = result[0] if isinstance(result, tuple) else result
            stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else None
            entry = {"zero_stage": stage, "wrapped_by": ["deepspeed"]}
            _facts.setdefault("deepspeed", {}).setdefault("initialize", []).append(entry)
            _write()
        except Exception:
            pass
        return result

    watched_initialize._compat_matrix_watched = True  # type: ignore[attr-defined]
    module.initialize = watched_initialize


_AFTER_IMPORT = {
    "accelerate.accelerator": _watch_accelerator,
    "deepspeed": _watch_deepspeed,
    "torch.distributed.distributed_c10d": _watch_process_group,
}


#: The modules `_AfterImport` is looking up now.
_ASKING: set[str] = set()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a watcher right after a module of `_AFTER_IMPORT` is first executed, whoever imports it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        # Another finder that asks every other finder (the revert's) asks this one back while it is asking: the
        # second ask is left to the others, or the two would ask each other without end.
        if fullname not in _AFTER_IMPORT or fullname in _ASKING:
            return None
        _ASKING.add(fullname)
        try:
            return self._spec(fullname, path, target)
        finally:
            _ASKING.discard(fullname)

    def _spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader, watcher = spec.loader, _AFTER_IMPORT[fullname]
                original = loader.exec_module

                def exec_module(module: Any, original: Any = original, watcher: Any = watcher) -> None:
                    original(module)
                    try:
                        watcher(module)
                    except Exception:
                        pass

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows (a distribution may ship one further down the path)."""
    # Only the entries after this one's: two of ours that each ran the first other one would run each other forever.
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or ".") for entry in sys.path]
    for entry in entries[entries.index(here) + 1 :] if here in entries else entries:
        candidate = os.path.join(entry, "sitecustomize.py")
        if entry == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_compat_matrix_next_sitecustomize", candidate)
        if spec and spec.loader:
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception:
                pass
        return


if _OUT:
    import atexit

    sys.meta_path.insert(0, _AfterImport())
    atexit.register(_write)
    _write()
_chain_next_sitecustomize()
