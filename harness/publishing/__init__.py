"""The table and what stands beside it: `stage.write_report` writes COMPATIBILITY.md (glance, summary, atlas and
flips, device comparison), `publish` the site's data, `repro` the standalone reproducers, `upstream` the issue
bodies and upstream links."""
