"""`python -m bench`: the end-to-end benchmark against datatrove (bench/e2e.py)."""

from bench.e2e import main

main()
