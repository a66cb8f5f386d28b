"""`adapters-grid`: adapters saved on each atlas day and loaded on the others, and its flips swept to a release."""
