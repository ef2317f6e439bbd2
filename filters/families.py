"""Imports every built-in filter family so that its types register themselves."""

from filters import adapters, c4, fineweb, gopher, language, length, patterns, web  # noqa: F401
