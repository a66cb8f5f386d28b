"""What a run is made of, before anything runs: profiles (`profile.load_profile`), the scenarios found on disk
(`registry.discover`, `registry.select`), cells as version combinations (`cells.expand`) and the packages the
matrix varies (`packages.AXIS_PACKAGES`). Pure: no install, no process, no clock."""
