"""The stages, one module or package each: `plan(ctx)`, its tasks, what it publishes.

The order they plan and publish in is `STAGES` (pipeline/run/graph.py); how to add one:
docs/extending.md."""
