"""What Curate writes never holds a secret, and what it publishes nothing of the machine.

`secrets(text)`: a URL's credentials (`s3://KEY:SECRET@host/...`, `https://user:token@...`) and
query strings that carry tokens are cut from any string written to run.json, logs or a
published folder. `guard_streams()` makes every line a command prints (its log, progress and
error lines, a library's warnings) pass through it. `portable(obj, base)`: for a published dataset, absolute local paths become
paths relative to the mixture file's folder (`base`; without one, their last two
components); host names and machine settings are left to the caller to drop.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/@\s\"':]+:[^@\s\"']*|[^/@\s\"']+)@")
_TOKEN_QUERY = re.compile(r"([?&](?:[A-Za-z0-9_-]*(?:token|key|secret|signature|sig|password|credential)[A-Za-z0-9_-]*)=)[^&\s\"']+",
                          re.IGNORECASE)
_ABS = re.compile(r"(?<![\w:/.])/(?:[^\s\"':,\]\}\)]+/)*[^\s\"':,\]\}\)]+")


def secrets(text: str) -> str:
    """`text` without URL credentials or token-carrying query values."""
    return _TOKEN_QUERY.sub(r"\1***", _USERINFO.sub(r"\1", text))


def _relative(p: str, base: Path | None) -> str:
    if base is not None:
        try:
            return os.path.relpath(p, base)
        except ValueError:
            return _tail(p)
    return _tail(p)


def _tail(p: str) -> str:
    parts = [x for x in p.split("/") if x]
    return "/".join(parts[-2:]) if len(parts) > 1 else (parts[0] if parts else p)


def portable(obj, base: Path | None):
    """`obj` (JSON-like) with every string's secrets cut and its absolute local paths made
    relative to `base` (or cut to their last two components)."""
    def paths(s: str) -> str:
        s = secrets(s)
        return _ABS.sub(lambda m: _relative(m.group(0), base), s) if "/" in s else s

    return _walk(obj, paths)


def portable_secrets(obj):
    """`obj` (JSON-like) with every string's secrets cut, paths left as they are (run.json)."""
    return _walk(obj, lambda s: secrets(s) if "@" in s or "=" in s else s)


def _walk(obj, fn):
    """`obj` (JSON-like) with `fn` applied to every string in it."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    return obj


class _Redacting:
    """A text stream that writes through another with `secrets` applied to each write (a
    print's line: a URL is never split across two writes of one print)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(secrets(text) if ("@" in text or "=" in text) else text)
        return len(text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding...: the stream's own
        return getattr(self._stream, name)


def guard_streams() -> None:
    """sys.stdout and sys.stderr through `secrets` from now on (once)."""
    import sys

    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if s is not None and not isinstance(s, _Redacting):
            setattr(sys, name, _Redacting(s))
