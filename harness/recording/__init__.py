"""What a run leaves behind and how it is read back: records (`record.make_record`, `records.read_records`),
runs and their meta (`runs`), failure names (`signatures`), verdicts per cell and scenario (`verdicts.verdict`),
packing, and the one flip type (`flip.Flip`) every bisector writes."""
