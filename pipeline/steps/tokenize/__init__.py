"""Tokenized output: the mixture as trainer-ready token files (plan.py encodes, write.py writes)."""
