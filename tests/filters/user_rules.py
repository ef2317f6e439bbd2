"""User filter functions for the python adapter's tests."""

import pyarrow.compute as pc


def no_digits(text: str):
    return (False, "has_digits") if any(c.isdigit() for c in text) else True


def min_len(batch, n: int):
    lens = pc.utf8_length(batch.column("text")).to_pylist()
    return [x >= n for x in lens], [None if x >= n else f"shorter_than_{n}" for x in lens]
