"""Imports every built-in filter family so that its types register themselves."""

from filters import length  # noqa: F401
