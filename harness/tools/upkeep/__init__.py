"""The project's own upkeep: benchmarks side by side (`bench`, the site's first render), the docs' example outputs."""
