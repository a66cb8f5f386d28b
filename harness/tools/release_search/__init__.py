"""Which release flipped an outcome: one pure search every bisector asks, and the bisect, flips and sweep probes."""
