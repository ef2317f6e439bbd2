"""The engine: hashed steps, the shard task, Ray, leases, progress and the scheduling loop.

It knows nothing of mixtures: `steps/` builds `Step`s, `run/` hands them to the `Executor`."""
