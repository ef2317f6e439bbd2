"""Text the benches share, made from what the project can fetch (the wheels `make` puts in
.cache/wheels, or CURATE_WHEEL_DIR): crawl pages around Wikipedia extracts."""

from __future__ import annotations

import os
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = Path(os.environ.get("CURATE_WHEEL_DIR") or ROOT / ".cache" / "wheels")  # the wheel cache `make` fills


def crawl_pages(n_docs: int, seed: int = 1) -> list[str]:
    from pipeline import demo_data

    wiki = demo_data.wiki_records(demo_data.wheel(WHEEL_DIR))["en"]
    rng = random.Random(seed)
    pages = demo_data.web_records(wiki, n_docs, seed=seed)
    out = []
    for p in pages:
        text = p["text"]
        if p["kind"] in ("article", "near_copy", "exact_copy"):
            while len(text) < 2700:
                text += "\n\n" + rng.choice(wiki)["text"]
        out.append(text)
    return out
