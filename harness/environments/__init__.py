"""Where a cell's packages come from: `envs.ensure_env` builds or reuses a cell's environment (uv, or an
`overlay` over a node's own torch), `wheelhouse`/`era_wheels`/`wheel_pack` carry wheels to an air-gapped node,
`overlay` is the one way a `--target` overlay is installed and thrown away."""
