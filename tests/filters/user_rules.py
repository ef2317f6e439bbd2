"""User filter functions for the python adapter's tests."""

import pyarrow.compute as pc


def no_digits(text: str):
    return (False, "has_digits") if any(c.isdigit() for c in text) else True


def min_len(batch, n: int):
    lens = pc.utf8_length(batch.column("text")).to_pylist()
    return [x >= n for x in lens], [None if x >= n else f"shorter_than_{n}" for x in lens]


def crash_once(text: str, marker: str):
    """Kills its worker process the first time any worker runs it (a lost worker, for Ray to retry)."""
    import os

    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return True
    os.close(fd)
    os._exit(1)
