"""A mixture to a run: the stage list and its graph, the dry run, the run record and its ownership, the outputs and the ledger."""
