"""The air-gapped GPU node: its era lock, and the flips, watch and bisect-script rounds planned here and run there."""
