"""The files users have, read as the tools that write them do: requirements, locks, conda, configs, for one target."""
