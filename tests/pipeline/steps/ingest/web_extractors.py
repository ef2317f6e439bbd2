"""An extractor for tests/pipeline/steps/ingest/test_web.py that misbehaves on request: sleeps, raises,
kills its own process, hogs memory or spins, or lists the names in its environment (ENV), by the
word in the page; otherwise strips the tags."""

import os
import re
import signal
import time


def extract(html: str) -> str:
    if "SLEEP" in html:
        time.sleep(600)
    if "RAISE" in html:
        raise ValueError("cannot parse this page")
    if "CRASH" in html:
        os.kill(os.getpid(), signal.SIGKILL)
    if "HOG" in html:
        return str(len(bytearray(3 << 30)))  # 3 GB: over the sandbox's address-space cap
    if "ENV" in html:
        return " ".join(sorted(os.environ))
    if "SPIN" in html:
        while True:
            pass
    return re.sub(r"<[^>]+>", "", html)
