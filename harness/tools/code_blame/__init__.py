"""From the release to the function: a finding verified by its reproducer, then the changed code it ran blamed."""
