"""Error classes that carry their policy (the Dolma idea).

- `UsageError`: bad command line or bad config. Exit 2, no traceback.
- `InputError`: a bad input record or file under `on_bad_record: fail`. It fails the
  shard with `path:line: what; what to do`, and the run exits 1.
- `RunError`: a step could not finish (a shard failed, conservation broke). Exit 1.
- `TransientError`: an I/O fault that may pass (throttling, a reset connection, a timeout,
  a 5xx, EIO) still there after a shard's own retries: Ray runs the shard again.

Every message says where, what, and how to fix it; the CLI prints the message only.
"""

import os


class CurateError(Exception):
    exit_code = 1


class UsageError(CurateError):
    exit_code = 2


class InputError(CurateError):
    exit_code = 1


class RunError(CurateError):
    exit_code = 1


class TransientError(RunError):
    exit_code = 1


def env_int(name: str, default: int, what: str, least: int = 1) -> int:
    """An integer setting from the environment (benches and tests lower the product's
    defaults through them), or `default` when unset; a bad value is a UsageError naming it."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    if not v.isdigit() or int(v) < least:
        raise UsageError(f"{name}={v!r}: give {what} ({least} or more), or unset it for {default:,}")
    return int(v)
