"""Committing a file to an object store (issue 58, "three write-class requests per committed
file"): the same files written two ways on moto's S3 server with every request held
`--latency-ms`, in the same run: a temporary object, then `atomic.commit` (a server-side copy to
the final key, the temporary deleted: what the streaming Parquet writers still do), against
`atomic.creating` (straight to the final key; what markers, indexes, shuffle files and
`atomic.write_table` use). Each write is recorded as a task's would be (`fs.recording`: the
final object's ETag, one HEAD). Requests by kind and milliseconds per file.

    python -m bench.commits [--files 50] [--kb 64] [--latency-ms 20]

Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.objstore import Server
from bench.publish import _count


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.commits", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--kb", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    a = ap.parse_args(argv)
    server = Server(Path(tempfile.mkdtemp(prefix="curate-commits-")) / "moto.log", a.latency_ms)
    try:
        os.environ.update({k: v for k, v in server.env.items() if k.startswith("AWS_")})
        import s3fs

        from pipeline.io import atomic, fs

        s3fs.S3FileSystem(skip_instance_cache=True).mkdir("commits")
        data = os.urandom(a.kb << 10)
        d = fs.path("s3://commits")

        def temporary(p):
            tmp = atomic.tmp_path(p)
            with tmp.open("wb") as f:
                f.write(data)
            atomic.commit(tmp, p)

        def creating(p):
            with atomic.creating(p) as f:
                f.write(data)

        print(f"{a.files} files of {a.kb} KB, {a.latency_ms:.0f} ms a request\n")
        print("| how | requests a file | of which write-class (PUT, COPY, DELETE) | by kind | ms a file |")
        print("| --- | ---: | ---: | --- | ---: |")
        for name, fn in (("temporary, then commit (copy + delete)", temporary), ("straight to the final key", creating)):
            mark = server.mark()
            t0 = time.time()
            with fs.recording():
                for i in range(a.files):
                    fn(d / name.split(",")[0].split()[0] / f"f-{i:05d}.bin")
            ms = (time.time() - t0) * 1000 / a.files
            time.sleep(0.3)  # the server's log written
            c = _count(server, mark)
            writes = c["PUT"] + c["DELETE"] + c["POST"]
            kinds = ", ".join(f"{k} {v / a.files:.1f}" for k, v in sorted(c.items()))
            print(f"| {name} | {sum(c.values()) / a.files:.1f} | {writes / a.files:.1f} | {kinds} | {ms:.0f} |", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
