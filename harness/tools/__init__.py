"""The commands' bodies that sit right under the CLI, in families, one subpackage each (docs/architecture.md, "tools/
in families"): `answers`, `user_files`, `release_search`, `code_blame`, `script_verdicts`, `growth`, `gpu_node`,
`adapter_grid`, `upkeep`."""
