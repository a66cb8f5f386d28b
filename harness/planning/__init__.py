"""Which cells and configs one invocation runs: `plan.build_plan` (cells sliced by --cell/--shard/--world-size,
pruned where pins cannot work together: `pruning`) and `draws` (Hypothesis-drawn configs and the failure
memory they start from)."""
