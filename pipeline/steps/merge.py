"""A merge tier between a shuffle's writers and its readers, so that reads per document stay
flat as the corpus and its partitions grow together.

Without it, every reader of a shuffle (a reducer, or a document shard taking its decisions
back) reads its segment from every writer's file: writers x readers ranged reads, which
grows as the square of the corpus (pipeline/shards/shuffle.py). A merge task takes a group
of `group` consecutive writers' files and writes one file with each partition's segments
back to back, a byte copy that streams each input once; the readers then read one segment
per group. With S writers, P readers and groups of G: S/G merge tasks reading 2S files
front to back, and P x S/G ranged reads instead of P x S. Readers get the same rows in the
same order (segments concatenate in writer order), so every byte downstream is the same.

When there are at most `group` writers the merge step has no shard, and readers read the
writers' files as before: a small run pays one empty step, not a round of tasks. Above
GROUP x FANIN writers (2,048) the groups grow instead of the readers' files: a reader then
reads at most FANIN = 64 files whatever the corpus, and a merge task streams more files
with less read-ahead each (256 MB in all up to 1,024 files a group, i.e. 65,536 writers;
256 KB a file beyond), so its memory stays flat while its work grows with the corpus (at
10^9 documents, 20,000 writers: groups of 313 files, ~1 MB of keys each for the dedup maps).

Every shuffle's writers report the bytes they wrote (engine/task.py: their `.data` files;
the text-carrying ones, mix-route -> mix and fuzzy fetch -> verify, would otherwise make
merge tasks of tens of GB at 10^9 documents, and fuzzy signatures hundreds at 2.5 x 10^10),
and a group over SPLIT_BYTES (2 GB) is merged by R tasks, each one contiguous range of the
partitions (read from the range's first byte of every file): merged file r x groups + j,
and a reader of partition p reads only its range's `groups` files (shuffle.files_of).

    mg = merge_step("dedup-exact-map-merge", mp, ["buckets"], lambda stats: len(stats[mp.name]), ctx.store, ctx.engine)
    folder, files = read_from(stats, mp, mg, len(stats[mp.name]), ctx.store)  # then folder/buckets
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NotRequired, TypedDict

from pipeline.config.engine import DEFAULTS, EngineSpec
from pipeline.engine.step import Step, task
from pipeline.io import fs
from pipeline.shards import shuffle

GROUP = DEFAULTS["shuffle_group"]  # writers per merge task at least (engine.shuffle_group)
FANIN = DEFAULTS["shuffle_fanin"]  # files a reader reads at most: above GROUP x FANIN writers, groups grow instead
MEMORY = 256 << 20  # a merge task's read-ahead over all of its files (4 MB a file up to 64 files)
# a merge task's memory: a worker's base, the read-ahead of all its files and its offset-index window
MERGE_TASK_MB = 512 + (MEMORY >> 20) + (shuffle.INDEX_WINDOW >> 20)


def task_mb(group_size: int) -> int:
    """The memory a merge task of `group_size` files declares: a worker's base, the read-ahead
    of all its open files (past 1,024 files the 256 KB floor a file is more than MEMORY:
    7,813 files hold 2 GB) and its offset-index window."""
    return 512 + -(-read_ahead(group_size) * group_size >> 20) + (shuffle.INDEX_WINDOW >> 20)
SPLIT_BYTES = DEFAULTS["merge_bytes"]  # a merge task copies at most about this much (engine.merge_bytes): larger groups split by partition ranges


def group_size(writers: int, least: int = GROUP, fanin: int = FANIN) -> int:
    """Writers per merge task: `least` (engine.shuffle_group), or more when that would leave
    a reader more than `fanin` (engine.shuffle_fanin) files, so that a reader's requests stay
    flat as writers grow."""
    return max(least, -(-writers // fanin))


def read_ahead(group_size: int) -> int:
    """Read-ahead per input file of a merge task of `group_size` files: MEMORY in all, at
    most 4 MB and at least 256 KB a file."""
    return max(256 << 10, min(4 << 20, MEMORY // max(1, group_size)))


class MergeSpec(TypedDict):
    """A shuffle-merge shard (merge.py `merge_step`): one group of writers' files, or one partition range of them."""

    inputs: str  # the writing step's folder
    subs: list[str]  # its subfolders merged
    first: int  # the group's writers: [first, last)
    last: int
    span: NotRequired[list[int]]  # [range, ranges] when the group is split by partition ranges
    groups: NotRequired[int]  # then the number of groups
    describe: str


@task(version="1")
def merge_shard(spec: MergeSpec, out) -> dict:
    """One group of writers' files (or one partition range of them), per subfolder, merged
    into this step's folder."""
    res = {}
    span = spec.get("span")
    for sub in spec["subs"]:
        res[sub] = shuffle.merge(fs.path(spec["inputs"]) / sub, spec["first"], spec["last"],
                                 shuffle.map_file(fs.path(out.dir) / sub, out.index),
                                 buffering=read_ahead(spec["last"] - spec["first"]), span=tuple(span) if span else None)
    parts = {r["partitions"] for r in res.values()}
    if span and len(parts) > 1:
        raise ValueError(f"{spec['inputs']}: subfolders {spec['subs']} disagree on the number of partitions {sorted(parts)}")
    ranges = {"groups": spec["groups"], "ranges": span[1], "partitions": parts.pop()} if span else {}
    return {"rows": 0, "maps": spec["last"] - spec["first"], "bytes": sum(r["bytes"] for r in res.values()), **ranges}


def merge_step(name: str, src: Step, subs: list[str], count: Callable[[dict], int], store, engine: EngineSpec,
               split: bool = True) -> Step:
    """A step merging `src`'s shuffle files under each of `subs` in groups; `count(stats)`
    is how many files `src` wrote per subfolder. `split` (every merge by default): a group
    holding more than `engine.merge_bytes` of the bytes its writers wrote (`shuffle_bytes`:
    every shuffle writer's marker has it, engine/task.py) is merged by R tasks, each one range
    of the partitions (file r x groups + j: range r of group j), so that no merge task copies
    a large share of a shuffle (at 10^9 documents, 313 writers' texts are ~50 GB; at 2.5 x
    10^10 the fuzzy signatures' group would be ~650 GB in one task)."""
    g, f, most = engine.shuffle_group, engine.shuffle_fanin, engine.merge_bytes

    def shards(st, stats):
        n = count(stats)
        if n <= g:
            return []
        k = group_size(n, g, f)
        st.memory_mb = task_mb(k)  # what its tasks hold, known once the writers are: declared to Ray at submission
        starts = range(0, n, k)
        ranges = 1
        if split and len(stats[src.name]) == n:  # a file a writer (not a coordinator's many): its marker has its bytes
            sizes = [stats[src.name][i].get("shuffle_bytes", 0) for i in range(n)]
            ranges = max(1, min(max(-(-sum(sizes[a:a + k]) // most) for a in starts),
                                stats[src.name][0].get("partitions", 1)))  # no more ranges than partitions
        return [{"inputs": str(src.dir(store)), "subs": subs, "first": a, "last": min(n, a + k),
                 **({"span": [r, ranges], "groups": len(starts)} if ranges > 1 else {}),
                 "describe": f"{src.name} files {a}-{min(n, a + k) - 1}" + (f", partition range {r + 1} of {ranges}" if ranges > 1 else "")}
                for r in range(ranges) for a in starts]

    cfg = {"subs": subs, "group": g, **({"fanin": f} if f != FANIN else {}),  # the defaults keep the keys of earlier runs
           **({"split_bytes": most} if split and most != SPLIT_BYTES else {})}
    step = Step(name, "shuffle-merge", cfg, [src], merge_shard, shards=shards,
                memory_mb=MERGE_TASK_MB)  # declared (not hashed): a node runs no more merges than its memory holds
    step.meta["may_be_empty"] = True  # planned before its lease: with no task it takes none (engine/executor.py)
    step.meta["engine"] = {"shuffle_group": g, "shuffle_fanin": f, **({"merge_bytes": most} if split else {})}
    return step


def read_from(stats: dict, src: Step, merged: Step, count: int, store) -> tuple[str, int | list[int]]:
    """(folder, files) a reader of `src`'s shuffle reads: the merged files when the merge
    ran, else `src`'s own `count` files."""
    ms = stats.get(merged.name, {})
    if not ms:
        return str(src.dir(store)), count
    m = ms[0]
    if m.get("ranges", 1) > 1:  # a reader reads its range's files only (shuffle.files_of)
        return str(merged.dir(store)), [m["groups"], m["ranges"], m["partitions"]]
    return str(merged.dir(store)), len(ms)
