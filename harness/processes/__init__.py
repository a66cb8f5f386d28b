"""Processes the harness starts and must not leave behind: the orphan guard and the process-tree killer.

The bottom floor (stdlib only), so that every floor that starts a process (environment builds as well as
workers) can tag it and have the guard take it down when the harness dies."""
