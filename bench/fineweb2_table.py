"""Writes filters/data/fineweb2.json from a FineWeb-2 checkout (filters/fineweb2.py says what
it holds): `python -m bench.fineweb2_table PATH/TO/fineweb-2` (the fetch tool's snapshot of
huggingface/fineweb-2). Languages: lid.176's labels; FineWeb-2's language and script for each
from datatrove's tokenizer_assignment.csv (the default script of the code, or the code with
its script when another is the default); kept when datatrove splits its words with spaCy's
rule-based tokenizer, which Curate's word splitter reproduces offline, or with a segmenter
Curate runs too (Chinese: jieba; Thai: PyThaiNLP; Vietnamese: pyvi).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from filters.fineweb2 import DATA, SOURCE, table


def _rule_based(code: str) -> bool:
    import spacy

    try:
        return type(spacy.blank(code).tokenizer).__name__ == "Tokenizer"
    except Exception:  # a language spaCy cannot build without a package not installed here
        return False


def _words(r: dict) -> str | None:
    """The word-splitting language Curate gives a tokenizer_assignment.csv row, or None when
    it cannot split that language's words as datatrove does: spaCy's rule-based tokenizers,
    and the segmenters of filters/segmenters.py SEGMENTERS (jieba through spaCy's Chinese
    tokenizer, PyThaiNLP's ThaiTokenizer, pyvi through spaCy's Vietnamese tokenizer,
    SudachiPy through spaCy's Japanese tokenizer, kiwipiepy's KiwiTokenizer)."""
    from filters.segmenters import SEGMENTERS

    if r["type"] == "SpaCyTokenizer" and r["tok_code"] in SEGMENTERS:
        return r["tok_code"]
    if r["type"] == "ThaiTokenizer":
        return "th"
    if r["type"] == "KiwiTokenizer":
        return "ko"
    if r["type"] == "SpaCyTokenizer" and _rule_based(r["tok_code"]):
        return r["tok_code"]
    return None


# lid.176 labels (Wikipedia's codes) that FineWeb-2 covers under another ISO 639-3 code: `no` is what
# lid.176 says of Bokmål (FineWeb-2's nob; nno is `nn`), `tl` Tagalog (fil), `als` Alemannic (gsw, not
# Tosk Albanian's als), `bh` Bihari (its most written language, Bhojpuri)
ALIASES = {"no": "nob", "tl": "fil", "als": "gsw", "bh": "bho"}


def _rows(code: str, rows: list[dict]) -> list[dict]:
    """tokenizer_assignment.csv's rows for a lid.176 label: its ISO 639-1 code's default rows;
    else the alias's, or (a three-letter label) its ISO 639-3 code's, in their default script."""
    got = [r for r in rows if r["code_1"] == code and r["default_code_1"] == "TRUE" and code not in ALIASES]
    if got:
        return got
    three = ALIASES.get(code, code if len(code) == 3 else None)
    return [r for r in rows if r["code_3"] == three and r["default_script"] == "TRUE"]


def build(repo: Path) -> dict:
    """The table from a FineWeb-2 checkout, for lid.176's languages."""
    import datatrove

    from filters import language, models

    labels = [lab[9:] for lab in language.load_model(str(models.lid176_path())).get_labels()]
    rows = list(csv.DictReader(open(Path(datatrove.__file__).parent / "assets" / "tokenizer_assignment.csv")))
    out: dict[str, dict] = {}
    for code in sorted(labels):
        for r in _rows(code, rows):
            cfg = repo / "configs" / f"{r['code_3']}_{r['script']}.yml"
            words = _words(r)
            if not cfg.exists() or words is None:
                continue
            import yaml

            c = yaml.safe_load(cfg.read_text())
            key = code if r["default_script"] == "TRUE" or code in ALIASES or len(code) == 3 else f"{code}_{r['script']}"
            out[key] = {"fineweb2": f"{r['code_3']}_{r['script']}", "script": r["script"], "words": words,
                        **{k: c[k] for k in ("dup_line_frac", "top_n_grams", "dup_n_grams", "line_punct_thr",
                                             "new_line_ratio", "min_avg_word_length", "max_avg_word_length",
                                             "max_non_alpha_words_ratio", "stopwords", "language_score")}}
    return {"source": SOURCE, "languages": out}


def main() -> None:
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(build(Path(sys.argv[1])), ensure_ascii=False, indent=0, sort_keys=True) + "\n")
    print(f"wrote {DATA}: {len(table())} languages")


if __name__ == "__main__":
    main()
