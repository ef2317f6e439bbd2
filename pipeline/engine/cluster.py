"""Where tasks run: join RAY_ADDRESS or start an embedded local Ray, and check that every
node of a cluster sees the run directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.errors import RunError, UsageError
from pipeline.io import atomic, fs


def _clear_stale_local_ray() -> str | None:
    """A Ray killed without shutdown leaves `ray_current_cluster` behind, and tools that read
    it then try to join a dead cluster. Clear it when nothing answers at its address."""
    import socket
    import tempfile

    root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    current = root / "ray_current_cluster"
    if not current.is_file():
        return None
    address = current.read_text().strip().splitlines()[0] if current.stat().st_size else ""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return None  # a live cluster: leave it alone
    except (OSError, ValueError):
        pass
    current.unlink(missing_ok=True)
    return f"note: cleared a stale Ray address file ({current}: {address or 'empty'}) left by a Ray that was killed; starting a fresh local Ray"


def start_ray(workers: int | None) -> bool:
    """Join RAY_ADDRESS if set, else start an embedded Ray. Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("CURATE_FORBID_RAY"):  # the test suite's fast half (tests/conftest.py): no Ray at all
        raise RunError("CURATE_FORBID_RAY is set (make test-fast): this command would start or join a Ray; "
                       "the test that ran it needs the `ray` or `e2e` marker (tests/conftest.py sets them)")
    # after a failed shard the others are cancelled; their errors are not news
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    if os.environ.get("RAY_ADDRESS"):  # Ray's own INFO lines ("Connecting to existing Ray cluster") would break
        # `--log-format json`'s one JSON object a line, and say nothing the run's first line does not
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True, logging_level="ERROR")
        return True
    msg = _clear_stale_local_ray()
    if msg:
        print(msg, file=sys.stderr)
    ray.init(
        address="local",
        num_cpus=workers or os.cpu_count(),
        include_dashboard=False,
        log_to_driver=True,
        logging_level="ERROR",
        configure_logging=True,
    )
    return True


def stop_ray() -> None:
    """Disconnect (or stop the embedded Ray) now: Ray's own exit hook takes about 0.6 s longer."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def check_shared_output(run_dir) -> None:
    """On a cluster, every node writes into the run directory: a local path must be a shared
    filesystem. One zero-CPU task per node looks for a probe file the driver wrote."""
    import socket
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not fs.is_local(run_dir):
        return
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if len(nodes) <= 1:
        return
    probe = fs.path(run_dir) / f".probe-{uuid.uuid4().hex[:8]}"
    atomic.write_bytes(probe, b"curate")

    def sees(p: str) -> tuple[bool, str]:
        return os.path.exists(p), socket.gethostname()

    task = ray.remote(num_cpus=0, max_retries=0)(sees)
    try:
        found = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                         .remote(str(probe)) for n in nodes], timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    blind = sorted({host for ok, host in found if not ok})
    if blind:
        raise UsageError(
            f"output {run_dir} is a local path that {len(blind)} of {len(nodes)} cluster nodes cannot see "
            f"({', '.join(blind)}); on a cluster the run directory must be on a filesystem every node mounts, "
            "or an object-store URL: --output s3://bucket/runs (pip install 'curate[s3]')"
        )
