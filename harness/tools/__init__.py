"""The commands' bodies that sit right under the CLI: `check`, `lookup`, `bench`, the bisectors (`bisection`,
`flips`, `node_flips`, `script_bisect` over `script_stacks`; all ask `flip_search` for their next probe),
`locking`."""
