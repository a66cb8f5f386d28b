"""The orchestrator: matrix -> cells -> environments -> runs -> records -> reports.

Nothing in this package imports torch. The ML stack only ever lives inside cell environments, where
`harness/worker.py` (standard library only) runs the scenarios.
"""
