"""The answer commands, each a view of the one judge: `lookup` (`--measure`), `check`, `audit` (`--fix`)."""
