"""Curate: data-mixture curation for LLM pretraining data, on Ray.

`pipeline` holds the orchestration, in layers (docs/architecture.md): cli, run, views,
steps, plan, config and shards, mixing, engine, io; `filters` holds the filter and
classifier families and their registries.
"""

__version__ = "0.1.0"
