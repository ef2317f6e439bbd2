"""Inputs and outputs: discovering files, reading splits, writing shards atomically."""
