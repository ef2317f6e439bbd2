"""The samples stage: seeded samples of kept and removed documents per source, stage and reason."""
