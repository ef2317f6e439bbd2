"""Which errors may pass if the work runs again (throttling, a reset connection, a timeout, a
server's 5xx, EIO), for the shard task's own retries (engine/task.py) and for the readers,
which must not set aside as a damaged file what was only a passing fault of the store.
"""

from __future__ import annotations

import errno

from pipeline.errors import CurateError, TransientError

_TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT,
                     errno.EPIPE, errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ESTALE,
                     errno.EREMOTEIO}  # s3fs gives a server's 5xx as EREMOTEIO
_TRANSIENT_WORDS = ("SlowDown", "Throttl", "TooManyRequests", "RequestTimeout", "ServiceUnavailable", "InternalError",
                    "Service Unavailable", "Internal Server Error", "Bad Gateway", "Gateway Timeout", "Connection reset",
                    "Connection aborted", "timed out", "(500)", "(502)", "(503)", "(504)")


def transient(e: BaseException) -> bool:
    """An error that may pass if the shard runs again: throttling, a reset connection, a
    timeout, a server's 5xx, EIO. Never an input or config error (CurateError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, CurateError):
            return isinstance(e, TransientError)
        if isinstance(e, (TimeoutError, ConnectionError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        if any(w in f"{type(e).__name__} {e}" for w in _TRANSIENT_WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False
