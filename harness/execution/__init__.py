"""Running the jobs: `matrix.run_matrix` (one invocation: run dir, plan, meta), `executor.execute` (cells,
scenarios, workers), `launcher` (workers under torchrun, timeouts, every rank's stack), `script_launch` (a user's
own script, launched the same way), `shrink`, `progress`, `slurm`. Options in `options.MatrixOptions`."""
