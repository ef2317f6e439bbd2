"""The mix stage: priorities, the selection per cell, routing, and the mixture files."""
