"""Only the compiled part of Curate; everything else is in pyproject.toml.

filters/_native.c is spaCy's tokenizer loop for ASCII chunks (see filters/words.py).
It is optional: where no C compiler is found the install goes on and filters/words.py
uses its Python loop (the same words, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("filters._native", ["filters/_native.c"], optional=True,
                             extra_compile_args=["-O2"])])
