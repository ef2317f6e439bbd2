"""A coordinator's rounds of tasks: the fuzzy clusters' waves (pipeline/steps/dedup/components.py),
and `fan_out` for the tasks a selection hands its groups of files to (the quality threshold,
the mixture's selection, the samples: pipeline/shards/select.py). Each batch of calls runs
once as a phase, checkpointed, and between a phase's writers and the next phase's readers
sits the same merge tier as between steps (pipeline/steps/merge.py).

Without the tier, every task of a wave reads its segment of every file the previous wave
wrote: P x P ranged reads a wave, so a run's requests grow as the square of the partitions
(measured on S3: 2.95x per document from N to 4N, the one step that grew). With it, past
`group` writers the files are joined in groups first, and a reader reads at most `fanin`
of them (engine.shuffle_group, engine.shuffle_fanin, carried by the coordinator's spec): the same rows in the same order, so
the same bytes downstream.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.io import atomic, fs
from pipeline.shards import shuffle
from pipeline.steps.merge import FANIN, GROUP, group_size, read_ahead

Source = tuple[str, int]  # (folder, files): what a reader passes to shuffle.read_partition


class Runner:
    """Runs a batch of calls as Ray tasks (more than one partition) or in this process, each
    batch once: its results are checkpointed under `work/_done/<phase>.json`, so a coordinator
    retried by Ray or resumed by a rerun goes on from its last finished phase (every task
    writes its outputs atomically to names of its phase, so a phase cut short runs again
    whole and writes the same bytes)."""

    def __init__(self, parallel: bool, work: Path | None = None, group: int = GROUP, fanin: int = FANIN):
        self.group, self.fanin = group, fanin  # engine.shuffle_group and shuffle_fanin, as the planner read them
        self.done = fs.path(work) / "_done" if work is not None else None
        self.resumed = 0  # phases whose results came from a checkpoint
        self.merges = 0  # merge tasks run or resumed
        if parallel:
            import ray

            parallel = ray.is_initialized()  # a coordinator run inline (a small step, no Ray up) runs its rounds here
            self.ray = ray
            self.remote = {}
        self.parallel = parallel
        self.longest = 0.0  # the longest round task and its peak RSS, for the clusters marker
        self.peak_rss_mb = 0.0

    def phase(self, name: str, fn, calls: list[tuple]) -> list:
        """`map`, once per phase name: a finished phase's results are read back."""
        mark = self.done / f"{name}.json" if self.done is not None else None
        if mark is not None and mark.exists():
            self.resumed += 1
            return atomic.read_json(mark)
        out = self.map(fn, calls)
        if mark is not None:
            atomic.write_json(mark, out)
            out = atomic.read_json(mark)  # the same shapes (lists, not tuples) as a resumed phase
        return out

    def map(self, fn, calls: list[tuple]) -> list:
        if not self.parallel:
            out = [_timed(fn, *c) for c in calls]
        else:
            r = self.remote.get(fn)
            if r is None:
                r = self.remote[fn] = self.ray.remote(num_cpus=1, max_retries=3)(_timed)
            out = self.ray.get([r.remote(fn, *c) for c in calls])
        for o in out:
            fs.recorded(o[3])  # the round tasks' files, as the coordinator's own
        self.longest = max([self.longest] + [o[1] for o in out])
        self.peak_rss_mb = max([self.peak_rss_mb] + [o[2] for o in out])
        return [o[0] for o in out]

    def merged(self, name: str, folders: list, writers: int) -> list[Source]:
        """What the next phase reads of each folder's `writers` shuffle files: the files
        themselves up to the group, else their groups joined under `<folder>/merged` (one
        phase of merge tasks for all the folders)."""
        least, fanin = self.group, self.fanin
        if writers <= least:
            return [(str(f), writers) for f in folders]
        k = group_size(writers, least, fanin)
        starts = range(0, writers, k)
        calls = [(str(f), a, min(writers, a + k), str(fs.path(f) / "merged"), j) for f in folders for j, a in enumerate(starts)]
        self.phase(f"{name}-merge", merge_task, calls)
        self.merges += len(calls)
        return [(str(fs.path(f) / "merged"), len(starts)) for f in folders]


def fan_out(fn, calls: list[tuple]) -> list:
    """fn(*call) for each call: Ray tasks when this process runs under Ray (a coordinator
    such as a selection's tree: shards/select.py), else one after another here."""
    return Runner(True).map(fn, calls)


def merge_task(folder: str, first: int, last: int, out: str, index: int) -> int:
    """Writers first..last-1 of `folder` as merged file `index` of `out`; its bytes."""
    res = shuffle.merge(fs.path(folder), first, last, shuffle.map_file(fs.path(out), index),
                        buffering=read_ahead(last - first))
    return res["bytes"]


def _timed(fn, *args):
    """(fn(*args), seconds, peak RSS MB of the task, the files it committed with their
    digests: the coordinator's marker lists them as its own, engine/reuse.py)."""
    from pipeline.engine.task import peak_rss_mb, reset_peak_rss

    reset = reset_peak_rss()
    t0 = time.time()
    with fs.recording() as written:
        res = fn(*args)
    return res, time.time() - t0, peak_rss_mb(reset), written
