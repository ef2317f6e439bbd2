"""Curate: data-mixture curation for LLM pretraining data, on Ray.

`pipeline` holds orchestration (config, io, executor, steps, cli); `filters` holds
the document filters and their registry.
"""

__version__ = "0.1.0"
