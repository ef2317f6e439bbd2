"""PII redaction (filters/pii.py): recall on emails, IPs and phone numbers planted in real
text in several formats, no replacement of look-alikes (versions, dates, OIDs, code
literals, ISBNs, times, MAC addresses), and every replacement counted on a clean corpus of
Wikipedia summaries and standard-library modules."""

from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filters import base


def _pii():
    return base.build(base.parse_params({"type": "pii"}))


def _email(r: random.Random) -> str:
    user = r.choice(["jane.doe", "j_smith", "info", "marie-claire", "bob+news", "a.b.c", "user2024", "Sales.Team"])
    host = r.choice(["example.org", "mail.example.co.uk", "uni-bonn.de", "example.com", "lists.example.net", "exemple.fr"])
    return f"{user}@{host}"


def _ipv4(r: random.Random) -> str:
    return r.choice([f"203.0.113.{r.randrange(1, 255)}", f"10.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(1, 255)}",
                     f"192.168.{r.randrange(256)}.{r.randrange(1, 255)}", f"8.8.{r.randrange(256)}.{r.randrange(256)}",
                     f"{r.randrange(11, 223)}.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(1, 255)}"])


def _ipv6(r: random.Random) -> str:
    g = [f"{r.randrange(1, 65536):x}" for _ in range(8)]
    return r.choice([":".join(g), f"2001:db8::{g[0]}:{g[1]}", f"fe80::{g[2]}:{g[3]}:{g[4]}", f"2001:db8:{g[5]}::{g[6]}",
                     f"::ffff:192.0.2.{r.randrange(1, 255)}"])


def _phone(r: random.Random) -> str:
    d = lambda k: "".join(str(r.randrange(10)) for _ in range(k))  # noqa: E731
    return r.choice([f"+1 {r.randrange(201, 999)} 555 {d(4)}", f"({r.randrange(201, 999)}) 555-{d(4)}",
                     f"{r.randrange(201, 999)}-555-{d(4)}", f"{r.randrange(201, 999)}.555.{d(4)}",
                     f"+44 20 {d(4)} {d(4)}", f"020 {d(4)} {d(4)}", f"+33 1 {d(2)} {d(2)} {d(2)} {d(2)}",
                     f"01 {d(2)} {d(2)} {d(2)} {d(2)}", f"+49 30 {d(8)}", f"+91 98765 {d(5)}", f"+1-415-555-{d(4)}"])


LOOKALIKES = ["version 1.2.3.4", "numpy==1.21.0.1", "v10.0.0.1", "OID 1.3.6.1.4.1.311", "1.2.3.4.5", "released 2024-05-01",
              "on 2024/05/01", "pi is 3.14159", "0x7f000001", "ISBN 978-3-16-148410-0", "at 12:30:45", "std::vector<int> a::b",
              "MAC 00:1A:2B:3C:4D:5E", "git@github.com:org/repo.git", "@property", "Build 10.0.19041.1", "release 4.1.0.2",
              "doi:10.1000/182", "from 1999-2003", "ZIP 12345-6789", "x = 1e-10", "range(0, 100, 5)", "2,147,483,647",
              "UUID 123e4567-e89b-12d3-a456-426614174000", "sha 3f786850e387550fdab836ed7e6dc881de23001b", "10:30 - 11:45",
              "page 12-34", "1.0.0-beta.2", "python3.11 -m venv", "tel. extension 1234"]
MAKERS = {"emails": _email, "ipv4": _ipv4, "ipv6": _ipv6, "phones": _phone}
CONTEXT = {"emails": ["Write to {} for details", "Questions? Write to {}"],
           # words ending in a version word's letters right before the address ("server", "received")
           "ipv4": ["The server at {} answered", "Report a problem (server {})", "Mail received from {} today"],
           "ipv6": ["Its address is {} now", "Served over {} since May"],
           "phones": ["Call {} after nine", "Leave a message: {}", "Press enquiries: {}"]}


@pytest.fixture(scope="module")
def summaries(demo_corpus):
    out = []
    for lang in ("en", "fr", "es"):
        out += pq.read_table(demo_corpus / "wiki" / f"summaries_{lang}.parquet", columns=["text"]).column("text").to_pylist()[:1500]
    return out


def _planted(pii, summaries):
    """2,000 summaries with one planted item and one look-alike each: per kind (planted, found),
    and the look-alikes the engine replaced."""
    r = random.Random(7)
    planted = {k: 0 for k in MAKERS}
    found = {k: 0 for k in MAKERS}
    touched = []
    for text in summaries[:2000]:
        kind = r.choice(list(MAKERS))
        value = MAKERS[kind](r)
        fake = r.choice(LOOKALIKES)
        sentences = text.split(". ")
        at = r.randrange(len(sentences) + 1)
        sentences.insert(at, r.choice(CONTEXT[kind]).format(value) + ", not " + fake)
        doc = ". ".join(sentences)
        new, counts = pii.redact(doc)
        planted[kind] += 1
        found[kind] += value not in new and counts[kind] >= 1
        if fake not in new:
            touched.append(fake)
    return planted, found, touched


def test_planted_pii_is_found_and_lookalikes_are_not(summaries):
    planted, found, touched = _planted(_pii(), summaries)
    assert touched == []  # no look-alike is ever touched
    for k in MAKERS:
        assert found[k] / planted[k] >= 0.99, (k, found[k], planted[k])
    print(f"\nrecall: {({k: f'{found[k]}/{planted[k]}' for k in MAKERS})}")


def test_the_presidio_engine_offline_on_the_same_plants(summaries, monkeypatch):
    """engine: presidio (Presidio's pattern recognizers, no NER model) on the same 2,000 plants:
    it runs with the network cut off, replaces through the same placeholders and counts, and
    its recall and the look-alikes it takes are printed beside the built-in engine's."""
    import socket

    def no_network(*a, **k):
        raise AssertionError("the presidio engine tried the network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    params = base.parse_params({"type": "pii", "engine": "presidio"})
    # what `curate validate` checks: the presidio engine names its package (installed here), the built-in one none
    assert base.filter_class("pii").dependencies(params) == [("presidio_analyzer", "presidio-analyzer>=2.2,<3")]
    assert base.missing_dependencies(params) == [] and base.filter_class("pii").dependencies(_pii().params) == []
    pres = base.build(params)
    new, counts = pres.redact("Mail jane.doe@example.org, call +1 (415) 555-0132, host 203.0.113.5.")
    assert new == "Mail <EMAIL>, call <PHONE>, host <IP_ADDRESS>." and counts["emails"] == counts["phones"] == counts["ipv4"] == 1
    planted, found, touched = _planted(pres, summaries)
    assert found["emails"] / planted["emails"] >= 0.99 and found["ipv4"] / planted["ipv4"] >= 0.99
    print(f"\npresidio engine: recall {({k: f'{found[k]}/{planted[k]}' for k in MAKERS})}; look-alikes replaced "
          f"{len(touched)} of 2,000 ({', '.join(sorted(set(touched))[:8])} ...)")
    # off-switches and public-only work the same
    quiet = base.build(base.parse_params({"type": "pii", "engine": "presidio", "phones": False, "only_public_ips": True}))
    assert quiet.redact("call +1 (415) 555-0132 from 10.0.0.1 or 8.8.8.8")[0] == "call +1 (415) 555-0132 from 10.0.0.1 or <IP_ADDRESS>"


def test_a_clean_corpus_counts_every_replacement(summaries, demo_corpus):
    code = []
    for f in sorted((demo_corpus / "code").glob("*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:
            code += [json.loads(x)["text"] for x in fh]
    texts = summaries + code
    assert len(texts) >= 5000
    res = _pii().apply(pa.record_batch({"id": [str(i) for i in range(len(texts))], "text": texts}))
    out = [n if n is not None else o for n, o in zip(res.texts, texts, strict=True)]
    for kind, mark in (("emails", "<EMAIL>"), ("phones", "<PHONE>")):
        assert int(res.changes[kind].sum()) == sum(t.count(mark) - o.count(mark) for t, o in zip(out, texts, strict=True))
    ips = int(res.changes["ipv4"].sum() + res.changes["ipv6"].sum())
    assert ips == sum(t.count("<IP_ADDRESS>") - o.count("<IP_ADDRESS>") for t, o in zip(out, texts, strict=True))
    # the clean corpus has real addresses (authors' emails, the ipaddress module's documented IPs), none of them phones
    assert res.changes["emails"].sum() >= 100 and ips >= 50 and res.changes["phones"].sum() == 0
    print(f"\n{len(texts):,} clean documents: " + ", ".join(f"{k} {int(v.sum()):,}" for k, v in res.changes.items())
          + f"; documents changed {sum(t is not None for t in res.texts):,}")
    # version strings in the standard library stay as they are
    assert all("__version__ = \"<" not in t for t in out)
