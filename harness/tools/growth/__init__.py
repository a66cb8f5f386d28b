"""The atlas keeps up: `matrix --grow`, `watch` and `grow`, the days and releases the table lacks run as new runs."""
