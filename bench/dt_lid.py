"""datatrove's LanguageFilter on the local lid.176 model file, with no download.

datatrove fetches its fastText model from a URL on first use; Curate's rule is no network
at run time. Importing this module points datatrove at the model file Curate uses, and it
is imported in every datatrove worker process, since the filter's class lives here.
"""

from __future__ import annotations

import datatrove.utils.lid as lid
from datatrove.pipeline.filters import LanguageFilter

from filters import models

lid.FT176LID.MODEL_URL = str(models.lid176_path())


class LocalLanguageFilter(LanguageFilter):
    """The same filter; only the model's location differs."""
