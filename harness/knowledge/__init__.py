"""What the atlas knows, as one model every answer reads: the runs that are evidence, their records as evidence, the
flips and the changes they name, the pitfalls, the findings, the known failures and the one judge over them."""
