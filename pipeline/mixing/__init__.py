"""The mixture's pure maths: cells (weights over sources, quality buckets and topics) and budgets (targets, epochs, priorities, phases). No I/O."""
