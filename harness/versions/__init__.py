"""Releases in time: which releases the index had on a day (`releases`), era locks of a dated profile
(`lock`, `lock_file`), and pairwise reduction of a cell product (`reduction`)."""
