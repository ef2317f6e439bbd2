"""`python -m pipeline` is the same as the `curate` command."""

from pipeline.cli import main

raise SystemExit(main())
