"""The cell-side runtime: what runs inside a cell's environment, beside torch and the stack.

`worker.py` serves many jobs in one process; `job.py` runs one job (distributed setup, the call into the
scenario, exception description). Standard library only, plus torch where a job needs it. Reproducers embed
`job.py` verbatim, so a reproducer runs a config exactly the way the worker did. Nothing here imports
`harness/` (the orchestrator), and nothing in `harness/` imports torch.
"""
