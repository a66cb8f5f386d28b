"""What one `matrix` invocation was asked to do, and what it did: shared by the run, the executor and the
per-scenario loop without an import loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.environments import envs


@dataclass
class MatrixOptions:
    results_dir: Path
    install: envs.InstallOptions
    fresh: bool = False
    #: Continue this run id (even a complete one: nothing recorded is re-run, an attempt entry is added).
    resume_run: str | None = None
    scenario_patterns: tuple[str, ...] | None = None
    cell_patterns: tuple[str, ...] | None = None
    examples: int | None = None
    #: Only these config ids (re-running one config, e.g. after fixing a scenario).
    config_ids: tuple[str, ...] | None = None
    #: Hypothesis example database (failure memory); None keeps no memory.
    example_db: Path | None = None
    #: Overrides the profile's hypothesis_profile ("ci" | "explore").
    hypothesis_profile: str | None = None
    #: (I, N): run only every N-th cell starting at the I-th (1-based), for several machines.
    shard: tuple[int, int] | None = None
    #: Only the cells of these world sizes (--world-size; a runner takes the cells its GPUs can hold).
    world_sizes: tuple[int, ...] | None = None
    #: A dated run: add the days its date rule gives now (and `add_dates`) to the resumed run's date axis.
    grow: bool = False
    add_dates: tuple[str, ...] = ()
    #: A new dated run on these install days instead of its date rule's.
    dates: tuple[str, ...] = ()
    #: Record drawn failures without shrinking them (quick runs, benchmarks of the batch itself).
    no_shrink: bool = False
    #: Skip reading package metadata to prune impossible cells.
    no_prune: bool = False
    #: Overrides the profile's `reduce` ("none" | "pairwise").
    reduce: str | None = None
    #: Workers a single-process scenario is packed over (default: one per GPU on CUDA, one per core on CPU).
    slots: int | None = None
    #: Start each scenario's workers only when its turn comes (default: while the previous scenario runs).
    no_early_start: bool = False
    #: Multi-node: distributed scenarios span this many Slurm nodes (srun + torchrun c10d; see execution/slurm.py).
    nnodes: int = 1
    rdzv_endpoint: str | None = None


@dataclass
class MatrixSummary:
    run_id: str
    run_dir: Path
    written: int
    resumed: int
    outcomes: dict[str, int]
    interrupted: bool = False
    #: SIGINT or SIGTERM when interrupted.
    signal: str | None = None
