"""The ingest stage: inputs (JSONL, Parquet, HF datasets, WARC/HTML) to normalised document shards, with quarantine, id checks and the id index."""
