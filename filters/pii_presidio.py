"""The `pii` rewriter's optional engine: Microsoft Presidio's pattern recognizers.

Presidio's AnalyzerEngine wants an NLP engine with a spaCy NER model, and spaCy's models
are not on PyPI (a download at run time, which Curate never does). Its email, IP and phone
recognizers need no model, so they are called directly: the email recognizer's check of the
domain uses tldextract's bundled public-suffix snapshot (tldextract would otherwise fetch the
list from the network on first use), the phone recognizer is the `phonenumbers` library's
matcher over Presidio's default regions. Matches become the same placeholders and the same
per-kind counts as the built-in engine, so the ledger and the sample browser read the same.
"""

from __future__ import annotations

import ipaddress


class Presidio:
    def __init__(self, params):
        import tldextract
        from presidio_analyzer.predefined_recognizers import EmailRecognizer, IpRecognizer, PhoneRecognizer

        offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)  # the bundled snapshot, no fetch

        class OfflineEmail(EmailRecognizer):
            def validate_result(self, pattern_text: str):
                return offline(pattern_text).fqdn != ""

        self.p = params
        self.replacement = {"emails": params.email_replacement, "ipv4": params.ip_replacement,
                            "ipv6": params.ip_replacement, "phones": params.phone_replacement}
        self.kinds = [k for k in ("emails", "ipv6", "ipv4", "phones") if getattr(params, k)]  # counted as the built-in engine counts
        self.recognizers = [r for on, r in ((params.emails, OfflineEmail()), (params.ipv4 or params.ipv6, IpRecognizer()),
                                            (params.phones, PhoneRecognizer())) if on]

    def _kind(self, entity: str, value: str) -> str | None:
        if entity == "EMAIL_ADDRESS":
            return "emails"
        if entity == "PHONE_NUMBER":
            return "phones"
        if entity == "IP_ADDRESS":
            kind = "ipv6" if ":" in value else "ipv4"
            if not getattr(self.p, kind):
                return None
            if self.p.only_public_ips:
                try:
                    if not ipaddress.ip_address(value).is_global:
                        return None
                except ValueError:
                    return None
            return kind
        return None

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, kind) of the matches to replace, without overlaps: the earliest first,
        then the longest."""
        found = []
        for r in self.recognizers:
            for m in r.analyze(text, r.supported_entities, None) or []:
                kind = self._kind(m.entity_type, text[m.start:m.end])
                if kind and m.score >= self.p.min_score:
                    found.append((m.start, -m.end, kind))
        out, last = [], -1
        for start, neg_end, kind in sorted(found):
            if start >= last:
                out.append((start, -neg_end, kind))
                last = -neg_end
        return out

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        counts = {"chars_replaced": 0, **dict.fromkeys(self.kinds, 0)}
        parts, pos = [], 0
        for start, end, kind in self.spans(text):
            parts += [text[pos:start], self.replacement[kind]]
            counts[kind] += 1
            counts["chars_replaced"] += end - start
            pos = end
        return "".join(parts) + text[pos:], counts
