"""Imports every built-in filter family so that its types register themselves."""

from filters import adapters, c4, fineweb, flagged, gopher, language, length, patterns, pii, rewrite, web  # noqa: F401
