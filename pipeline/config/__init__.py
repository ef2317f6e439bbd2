"""The mixture YAML as frozen, typed config, with errors that point at the line.

    models.py     the pydantic models, one per section (what a file may say); extract.py a web
                  source's `extract:` models
    lines.py      key paths to YAML lines (where it says it)
    load.py       a file to a LoadedMixture, every problem reported with its line
    checks.py     references between sections, and the one environment check that
                  `curate validate` and `curate run` both call
    reference.py  the generated key table of docs/

The names below are the package's public face; import them from `pipeline.config`.
"""

from pipeline.config.checks import check_references, environment, eval_files
from pipeline.config.extract import WEB_FORMATS, PythonExtract, ResiliparseExtract, TrafilaturaExtract
from pipeline.config.lines import dotted, line_of
from pipeline.config.load import format_problems, load
from pipeline.config.models import (
    ClassifierSpec,
    DecontaminateSpec,
    DedupSpec,
    EvalSetSpec,
    ExactDedupSpec,
    FuzzyDedupSpec,
    InputsSpec,
    LoadedMixture,
    Mixture,
    MixtureSpec,
    Model,
    ParagraphDedupSpec,
    PhaseSpec,
    PublishSpec,
    QualitySpec,
    SamplesSpec,
    SourceSpec,
    TopicSpec,
    ValidationSpec,
)
from pipeline.config.reference import reference_markdown
from pipeline.engine.step import hash_json

__all__ = ["ClassifierSpec", "DecontaminateSpec", "DedupSpec", "EvalSetSpec", "ExactDedupSpec", "FuzzyDedupSpec", "InputsSpec", "MixtureSpec", "Model", "ParagraphDedupSpec", "PhaseSpec", "PublishSpec", "PythonExtract", "QualitySpec", "ResiliparseExtract", "SamplesSpec", "SourceSpec", "TopicSpec", "TrafilaturaExtract", "ValidationSpec", "WEB_FORMATS", "LoadedMixture", "Mixture", "check_references", "dotted", "environment", "eval_files", "format_problems",
           "hash_json", "line_of", "load", "reference_markdown"]
