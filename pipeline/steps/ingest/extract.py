"""HTML to text: charset decoding, the extractors (resiliparse, trafilatura), and a
sandbox process that bounds the time any one page may take.

Why a process: extractors hang on pathological pages (trafilatura is known to; a hang
inside C code cannot be interrupted from Python), and one such page must not stall a
shard. Every page is extracted in a child process (one per ingest task; a fresh
interpreter, since Ray workers run threads and forking them is unsafe) under a CPU-time limit:
before each page the child arms ITIMER_PROF, whose signal kills it (the default action)
when the page has used `timeout` CPU seconds, even inside C code. The parent also keeps a
wall-clock guard (for a page that sleeps or deadlocks instead of computing). Either way the
page goes to quarantine as `extract_timeout`, a new child starts, and the shard goes on;
an extractor exception is `extract_error` (MemoryError too: the child's address space is
capped at `max_memory_mb`), a child that dies otherwise (a crash) is `extract_crash`.

The child gets only the environment it needs to run Python (`child_env`): an extractor
parses pages from the web, and a hostile page that gets code running in it must find no
cloud credentials (AWS_*, HF_TOKEN ...) in its environment. (Files the user can read, it
can read too: the process is a guard against hangs and crashes, not a security boundary.)

CPU time rather than wall time so that a busy machine does not change which pages time out:
the limit is a property of the page, not of the load, which keeps runs reproducible (a
page close to the limit can still fall either side on a different CPU; it is quarantined
with its time, never dropped silently).

Decoding: pages often lie about their charset. Bytes that are valid UTF-8 are UTF-8 (other
encodings of non-ASCII text are almost never valid UTF-8); otherwise the declared charset
(HTTP header, then the page's meta tag, read as browsers read labels: iso-8859-1 means
windows-1252) if the bytes decode under it; otherwise the charset uchardet detects
(resiliparse), decoding what does not fit as U+FFFD.
"""

from __future__ import annotations

import codecs
import re
import signal
import time

HTML_TYPES = ("text/html", "application/xhtml+xml")
WALL_FACTOR, WALL_EXTRA = 4.0, 10.0  # the wall-clock guard: 4x the CPU limit plus 10 s
START_TIMEOUT = 120.0  # seconds for a child to start and import its extractor


# what the extractor process keeps of the worker's environment: how to run Python and find its packages,
# the locale, time zone and temporary folder, thread counts, and Curate's own settings (CURATE_*)
CHILD_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
             "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONNOUSERSITE",
             "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONSAFEPATH", "VIRTUAL_ENV", "CONDA_PREFIX",
             "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX")
CHILD_ENV_PREFIXES = ("LC_", "CURATE_")
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY($|_)|AUTH", re.IGNORECASE)  # never, whatever the name


def child_env(environ: dict[str, str]) -> dict[str, str]:
    """The extractor process's environment: the allowlist above, less anything named like a secret."""
    return {k: v for k, v in environ.items()
            if (k in CHILD_ENV or k.startswith(CHILD_ENV_PREFIXES)) and not SECRET.search(k)}


# ---------------------------------------------------------------- decoding


def decode(payload: bytes, declared: str | None) -> tuple[str, str]:
    """(text, encoding used) of a page's bytes."""
    from resiliparse.parse.encoding import (
        bytes_to_str,
        detect_encoding,
        map_encoding_to_html5,
    )

    try:
        return payload.decode("utf-8").removeprefix("\ufeff"), "utf-8"
    except UnicodeDecodeError:
        pass
    # labels as browsers read them (WHATWG): iso-8859-1 and ascii mean windows-1252
    candidates = [map_encoding_to_html5(declared) if declared else None, detect_encoding(payload[:4096], from_html_meta=True)]
    for enc in candidates:
        if enc and _known(enc) and codecs.lookup(enc).name != "utf-8":
            try:
                return payload.decode(enc), codecs.lookup(enc).name
            except UnicodeDecodeError:
                continue
    found: str = detect_encoding(payload)
    return bytes_to_str(payload, found, errors="replace"), codecs.lookup(found).name if _known(found) else found


def _known(enc: str) -> bool:
    try:
        codecs.lookup(enc)
        return True
    except LookupError:
        return False


def is_html(content_type: str | None, payload: bytes | None) -> bool:
    """An HTML content type; with none declared, a payload that starts like HTML."""
    if content_type:
        return content_type.lower().split(";")[0].strip() in HTML_TYPES
    head = (payload or b"")[:1024].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))


# ---------------------------------------------------------------- extractors


def make_extractor(spec: dict):
    """A function html -> text for an `extract:` spec (see pipeline/config/models.py ExtractSpec)."""
    opts = {k: v for k, v in spec.items() if k not in ("type", "timeout", "max_memory_mb")}
    if spec["type"] == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        def run(html: str) -> str:
            return extract_plain_text(html, **opts)
    elif spec["type"] == "trafilatura":
        import trafilatura

        def run(html: str) -> str:
            return trafilatura.extract(html, output_format="txt", **opts) or ""
    elif spec["type"] == "python":
        from filters.adapters import _resolve

        run = _resolve(spec["callable"])
    else:
        raise ValueError(f"unknown extractor {spec['type']!r}")
    return run


def child_main() -> None:
    """The sandbox process (`python -c ...child_main()`): frames in on stdin, frames out on
    stdout. In: 4-byte length + UTF-8 HTML. Out: 4-byte length + JSON [status, value, cpu].
    A thread drains stdin into a queue, so the parent's next page never waits on this one."""
    import json
    import queue
    import resource
    import struct
    import sys
    import threading

    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the limit's signal ends the process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing an extractor prints may corrupt the frames
    spec = json.loads(sys.argv[1])
    if spec.get("max_memory_mb"):  # a page that needs more fails here, not in the worker
        cap = int(spec["max_memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    run = make_extractor(spec)
    run("<html><body><p>warm up</p></body></html>")
    limit = float(spec["timeout"])
    pages: queue.Queue = queue.Queue()

    def read_pages() -> None:
        while True:
            head = inp.read(4)
            if len(head) < 4:
                pages.put(None)
                return
            pages.put(inp.read(struct.unpack("<I", head)[0]))

    def send(obj) -> None:
        b = json.dumps(obj).encode()
        out.write(struct.pack("<I", len(b)) + b)
        out.flush()

    threading.Thread(target=read_pages, daemon=True).start()
    send(["ready", None, 0.0])
    while True:
        data = pages.get()
        if data is None:
            return
        html = data.decode("utf-8", "surrogatepass")
        t0 = time.thread_time()  # this thread's: the process clock reads stale here while the reader thread waits
        signal.setitimer(signal.ITIMER_PROF, limit)
        try:
            res = run(html)
            res = ["ok", res if isinstance(res, str) else ""]
        except Exception as e:  # noqa: BLE001  the page's error, not the run's
            res = ["error", f"{type(e).__name__}: {e}"[:500]]
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        send([*res, time.thread_time() - t0])


class Sandbox:
    """Extraction in a child process with a per-page time limit (see the module docstring).

    `submit(html, key)` queues a page and returns the results that are ready, in order, as
    (key, status, value): status ok (value: the text), error, timeout or crash (value: what
    happened). Up to DEPTH pages are in flight, so the parent reads and decodes the next page
    while the child extracts this one. When the child dies, the oldest page in flight is the
    one it died on; the pages queued behind it go to a new child. `drain()` returns the rest."""

    DEPTH = 2

    def __init__(self, spec: dict, wall: float | None = None):
        self.spec = spec
        self.limit = float(spec["timeout"])
        self.wall = wall or self.limit * WALL_FACTOR + WALL_EXTRA
        self.proc = None
        self.starts = 0
        self.cpu = 0.0  # extractor CPU seconds, summed over pages that finished
        self.inflight: list[tuple[object, bytes]] = []

    def _start(self):
        import json
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from pipeline.steps.ingest.extract import child_main; child_main()", json.dumps(self.spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=child_env(dict(os.environ)))
        self.starts += 1
        if not isinstance(self._recv(START_TIMEOUT), list):
            code = self.proc.poll()
            self.close()
            raise RuntimeError(f"the {self.spec['type']} extractor did not start (exit code {code}); is its package "
                               "installed on this node? (see the worker's log for the error)")

    def _recv(self, timeout: float):
        """The child's next frame (a list), "eof" when it died, "late" when the time ran out."""
        import json
        import select
        import struct

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return "late"
        head = _read_exact(self.proc.stdout, 4)
        if head is None:
            return "eof"
        body = _read_exact(self.proc.stdout, struct.unpack("<I", head)[0])
        return json.loads(body) if body is not None else "eof"

    def _write(self, data: bytes) -> None:
        import struct

        try:
            self.proc.stdin.write(struct.pack("<I", len(data)) + data)
        except (BrokenPipeError, OSError):  # the child died: the next _collect finds out and resends
            pass

    def submit(self, html: str, key) -> list[tuple]:
        if self.proc is None:
            self._start()
        data = html.encode("utf-8", "surrogatepass")
        self.inflight.append((key, data))
        self._write(data)
        done = []
        while len(self.inflight) > self.DEPTH:
            done.append(self._collect())
        return done

    def drain(self) -> list[tuple]:
        return [self._collect() for _ in range(len(self.inflight))]

    def _collect(self) -> tuple:
        """The oldest page in flight: (key, status, value)."""
        t0 = time.monotonic()
        res = self._recv(self.wall)
        key, _ = self.inflight.pop(0)
        if isinstance(res, list):
            status, value, cpu = res
            self.cpu += cpu
            return key, status, value
        if res == "late":  # alive but silent: the wall-clock guard
            self.close()
            msg = (f"extraction took over {self.wall:g} s of wall-clock time (the limit is {self.limit:g} CPU s; "
                   "the page waited without computing); the extractor process was stopped")
            out = (key, "timeout", msg)
        else:
            out = (key, *self._died(t0))
        if self.inflight:  # the pages queued behind it: to a new child
            self._start()
            for _, data in self.inflight:
                self._write(data)
        return out

    def extract(self, html: str) -> tuple[str, str]:
        """One page, synchronously: ("ok", text) | ("error" | "timeout" | "crash", message)."""
        done = self.submit(html, None) + self.drain()
        return done[-1][1], done[-1][2]

    def _died(self, t0: float) -> tuple[str, str]:
        code = self.proc.wait(5)
        self.close()
        if code == -signal.SIGPROF:
            return "timeout", (f"extraction used over {self.limit:g} CPU seconds (extract.timeout); "
                               f"stopped after {time.monotonic() - t0:.1f} s")
        return "crash", f"the extractor process died (exit code {code}; out of memory?)"

    def close(self):
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(5)
        self.proc = None


def _read_exact(f, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
