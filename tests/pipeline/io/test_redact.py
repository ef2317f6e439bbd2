"""Log and error lines pass URLs through redact.secrets (pipeline/io/redact.py): a command's
every printed line (its errors, progress, notes, a library's warnings) goes out without a
URL's credentials or token-carrying query values."""

from __future__ import annotations

import io
import sys

from pipeline.io import redact
from tests.conftest import curate, write_yaml


def test_an_error_naming_a_url_prints_it_without_its_secrets(tmp_path):
    y = write_yaml(tmp_path / "m.yaml", """
        name: t
        sources:
          d: {paths: ["http://user:s3cr3t@127.0.0.1:9/x.jsonl?token=abc123&page=2"]}
    """)
    r = curate("validate", str(y))
    assert r.returncode == 2, r.stderr
    assert "m.yaml:3: sources.d.paths[0]" in r.stderr and "http://127.0.0.1:9/x.jsonl?token=***&page=2" in r.stderr
    assert "s3cr3t" not in r.stderr + r.stdout and "abc123" not in r.stderr + r.stdout


def test_guarded_streams_cut_secrets_from_every_write(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # put back after the test, as stderr
    redact.guard_streams()
    redact.guard_streams()  # once: a second call wraps nothing again
    print("[ingest] reading s3://AKIAX:SeCrEt@bucket/a.jsonl and https://h/x?sig=zz9", file=sys.stderr)
    assert out.getvalue() == "[ingest] reading s3://bucket/a.jsonl and https://h/x?sig=***\n"
    assert sys.stderr.isatty() is False  # the stream's own attributes
