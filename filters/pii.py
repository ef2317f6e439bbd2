"""PII redaction: email addresses, IPv4 and IPv6 addresses and phone numbers become placeholders.

A rewriter (filters/rewrite.py): the replaced text flows to everything after it, and the
ledger counts replacements per kind. The patterns are written against what only looks
like PII in web pages, technical documents and code:

- IPv4: four octets 0-255 without leading zeros, not inside a longer dotted run
  (1.3.6.1.4.1 is an OID, 1.2.3.4.5 a version), not glued to a word (v1.2.3.4), and not
  after a version word or a pin (`version`, `__version__ = "`, `release`, `build`, `==`,
  `>=` ...); a first octet below 10 (8.2.4.44 is a section, 2.7.2.2 a version) needs an
  address word nearby (server, host, IP, DNS, gateway, received, blocked ...). `only_public_ips` keeps private and reserved addresses (datatrove's
  default), off by default.
- IPv6: a run of hex groups and colons (dots for an embedded IPv4) that `ipaddress`
  accepts, with at least three groups, so C++'s `a::b`, times (12:30:45) and MAC addresses
  are left alone.
- Email: local@domain.tld with a letter TLD; `git@host` (an SSH remote) is not a person.
- Phone: `+` and a country code with 8-15 digits in groups, North American (415) 555-0132 /
  415-555-0132 / 415.555.0132, and national numbers with a leading 0 in groups
  (020 7946 0958, 01 23 45 67 89); not inside longer digit runs, not after ISBN/DOI/a
  version word; dates (2024-05-01) and decimals have other shapes and never match.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Literal

from pydantic import Field

from filters.base import Filter, FilterParams, FilterResult, register_filter
from filters.rewrite import _result

OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = re.compile(rf"(?<![\w.]){OCTET}(?:\.{OCTET}){{3}}(?!\w)(?!\.\d)")
IPV6 = re.compile(r"(?<![\w:.])(?=[0-9A-Fa-f:]*:[0-9A-Fa-f:]*:)[0-9A-Fa-f:]+(?:\.\d{1,3}){0,3}(?![\w:])")
EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
                   r"[A-Za-z]{2,24}(?![\w-])")
PHONE = re.compile(
    r"(?<![\w+.-])(?:"
    r"\+\d{1,3}[\s.-]?(?:\(\d{1,4}\)[\s.-]?)?\d{1,5}(?:[\s.-]\d{2,8}){1,4}"   # international
    r"|\(\d{3}\)\s?\d{3}[\s.-]\d{4}|\d{3}([.-])\d{3}\1\d{4}|\d{3} \d{3} \d{4}"  # North American
    r"|0\d{1,4}(?:[ -]\d{2,4}){2,4}"                                            # national, leading 0
    r")(?![\w-])(?!\.\d)")
BEFORE = re.compile(r"(?:(?<![^\W\d_])(?:version|ver\.?|release[ds]?|rev(?:ision)?|build|isbn(?:-1[03])?|doi|v)|==|>=|<=|~=|!=|@)"
                    r"[\w.]*\s*[:=]?\s*[\"'(\[]?\s*$", re.IGNORECASE)
# words that make a dotted quad with a small first octet (8.2.4.44, 2.7.2.2: sections, versions) an address
IP_CONTEXT = re.compile(r"\b(?:ip|ipv4|address(?:es)?|adresse|dirección|server|serveur|servidor|host|hostname|ping|dns|"
                        r"gateway|subnet|proxy|router|connect(?:ed|ion)?|client|peer|listen(?:s|ing)?|nameserver|bind|"
                        r"firewall|route|interface|lan|wan|vpn|ssh|http|tcp|udp|port|e-?mail|smtp|received|sent|origin|"
                        r"blocked|banned|blacklist(?:ed)?|whitelist(?:ed)?|allowlist|denylist|visitors?|traffic|logged|login)\b",
                        re.IGNORECASE)


class PiiParams(FilterParams):
    type: Literal["pii"] = "pii"
    emails: bool = Field(True, description="replace email addresses")
    ipv4: bool = Field(True, description="replace IPv4 addresses")
    ipv6: bool = Field(True, description="replace IPv6 addresses")
    phones: bool = Field(True, description="replace phone numbers")
    only_public_ips: bool = Field(False, description="keep private, loopback and reserved addresses (datatrove's default)")
    email_replacement: str = Field("<EMAIL>", description="what an email address becomes")
    ip_replacement: str = Field("<IP_ADDRESS>", description="what an IP address becomes")
    phone_replacement: str = Field("<PHONE>", description="what a phone number becomes")
    engine: Literal["curate", "presidio"] = Field(
        "curate", description="curate: the patterns above; presidio: Microsoft Presidio's pattern recognizers (email, "
        "IP, phone numbers by the phonenumbers library), offline and without an NER model (needs `pip install "
        "presidio-analyzer`, the `presidio` extra)")
    min_score: float = Field(0.0, ge=0, le=1, description="engine presidio: drop matches Presidio scores below this "
                             "(it gives emails 1.0, IPs 0.6, phones 0.4)")


@register_filter("pii")
class Pii(Filter):
    """Replace email addresses, IPv4/IPv6 addresses and phone numbers with placeholders (counted per kind)."""

    Params = PiiParams

    @classmethod
    def dependencies(cls, params: PiiParams) -> list[tuple[str, str | None]]:
        """engine presidio needs Presidio's analyzer: `curate validate` names the pip line when it is missing."""
        return [("presidio_analyzer", "presidio-analyzer>=2.2,<3")] if params.engine == "presidio" else []

    @classmethod
    def used_libraries(cls, params: PiiParams) -> tuple[str, ...]:
        """engine presidio finds the spans with these (filters/pii_presidio.py): their versions enter the step hash."""
        return ("presidio_analyzer", "phonenumbers", "tldextract") if params.engine == "presidio" else ()

    def __init__(self, params: PiiParams):
        super().__init__(params)
        p = params
        self.kinds = [(k, rx, rep, ok) for k, on, rx, rep, ok in (
            ("emails", p.emails, EMAIL, p.email_replacement, self._email),
            ("ipv6", p.ipv6, IPV6, p.ip_replacement, self._ipv6),
            ("ipv4", p.ipv4, IPV4, p.ip_replacement, self._ipv4),
            ("phones", p.phones, PHONE, p.phone_replacement, self._phone)) if on]

    def _email(self, m: re.Match, text: str) -> bool:
        return not m.group(0).lower().startswith("git@")

    def _ipv4(self, m: re.Match, text: str) -> bool:
        if BEFORE.search(text, max(0, m.start() - 24), m.start()):
            return False
        first = int(m.group(0).split(".", 1)[0])
        if first < 10 and not IP_CONTEXT.search(text, max(0, m.start() - 60), min(len(text), m.end() + 30)):
            return False  # 8.2.4.44 (a section), 2.7.2.2 (a version): an address only where the text says so
        return not self.params.only_public_ips or ipaddress.IPv4Address(m.group(0)).is_global

    def _ipv6(self, m: re.Match, text: str) -> bool:
        s = m.group(0)
        try:
            ip = ipaddress.IPv6Address(s)
        except ValueError:
            return False
        groups = [g for g in s.split(":") if g]
        size = len(groups) + (1 if "." in s else 0)  # an embedded IPv4 tail is two groups
        return size >= 3 and (not self.params.only_public_ips or ip.is_global)

    def _phone(self, m: re.Match, text: str) -> bool:
        digits = sum(ch.isdigit() for ch in m.group(0))
        return 8 <= digits <= 15 and not BEFORE.search(text, max(0, m.start() - 24), m.start())

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        if self.params.engine == "presidio":
            return self.presidio.redact(text)
        counts = {"chars_replaced": 0}
        for kind, rx, rep, ok in self.kinds:
            n = 0

            def sub(m, ok=ok, rep=rep, text=text):
                nonlocal n
                if not ok(m, text):
                    return m.group(0)
                n += 1
                counts["chars_replaced"] += m.end() - m.start()
                return rep

            text = rx.sub(sub, text)
            counts[kind] = n
        return text, counts

    @functools.cached_property
    def presidio(self):
        """Presidio's recognizers, built on first use in the worker that needs them."""
        from filters.pii_presidio import Presidio

        return Presidio(self.params)

    def apply(self, batch) -> FilterResult:
        olds = batch.column("text").to_pylist()
        news, counts = [], {}
        for t in olds:
            new, c = self.redact(t)
            news.append(new)
            for k, v in c.items():
                counts.setdefault(k, []).append(v)
        return _result(olds, news, counts)
