"""`bisect-script` and `blame-script`: a user's own script across the atlas's stacks, by one evidence rule."""
