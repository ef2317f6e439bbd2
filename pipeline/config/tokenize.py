"""The `tokenize:` section: the mixture as trainer-ready token files (pipeline/steps/tokenize/).

    tokenize:
      formats: [megatron, datatrove, memmap, levanter]   # Megatron .bin/.idx, datatrove .ds/..., Dolma/OLMo .npy/.csv.gz,
                                                         # Levanter caches (tensorstore) with levanter-data.yaml
      eos: true                        # the tokenizer's end-of-text after every document
      dtype: auto                      # uint16 when the vocabulary fits, else each format's wide type
      max_file_tokens: 100000000       # a mixture shard's file split past this many tokens
      layout: mixture                  # or cells: a dataset per cell, the trainer's blend beside them
      pack: {seq_len: 2048, strategy: best_fit}   # optional: fixed sequences instead of one a document

Its own module so that the models file stays one screen of sections; models.py imports it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator



class PackSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    seq_len: int = Field(..., ge=2, description="tokens a training sequence holds (the trainer's context length)")
    strategy: Literal["concat", "best_fit"] = Field(
        "best_fit", description="concat: the documents back to back, cut every seq_len tokens; best_fit: only documents "
                                "longer than seq_len are cut, the pieces placed longest first into the sequence with the "
                                "least room that holds them (best-fit decreasing); sequences padded with the end-of-text id")


class TokenizeSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    formats: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]] = Field(
        ["megatron"], min_length=1, description="registered token formats (`curate formats`): megatron (.bin + .idx, "
                                                "MMIDIDX version 1), datatrove (.ds + .ds.index + .ds.metadata), memmap "
                                                "(Dolma/OLMo .npy + .csv.gz), levanter (Levanter caches: tensorstore zarr3 "
                                                "arrays, levanter-data.yaml)")
    tokenizer: str | None = Field(None, description="gpt2 or a tokenizer.json; default: the run's `tokenizer`")
    bos: str | None = Field(None, description="a special token put before every document (e.g. '<|endoftext|>'); default none")
    eos: bool = Field(True, description="the tokenizer's end-of-text token after every document; a literal "
                                        "'<|endoftext|>' inside a text is encoded as text, never as the special")
    dtype: Literal["auto", "uint16", "uint32", "int32"] = Field(
        "auto", description="token type: auto is uint16 when the vocabulary fits, else int32 for megatron (its .idx "
                            "has no uint32 code) and uint32 for datatrove and memmap")
    max_file_tokens: int | None = Field(None, ge=1, description="split a mixture shard's token file past this many "
                                                               "tokens (part-XXXXX-YYYYY); default: one file a shard")
    layout: Literal["mixture", "cells"] = Field(
        "mixture", description="mixture: the mixture's files as they are; cells: one dataset per cell "
                               "(tokenized/<format>/[<phase>/]<cell>/part-XXXXX.*, each the cell's documents of a mixture shard "
                               "in the mixture's order) with the trainer's blend of the cells' weights beside them, so a "
                               "trainer can reweight the cells without a new run; levanter: a cache per cell of every kept "
                               "document of the cell once, whatever the weights, which go to levanter-data.yaml")

    pack: PackSpec | None = Field(None, description="pack the documents into sequences of exactly seq_len tokens "
                                  "(one sequence a document when unset); needs eos (the padding)")

    @field_validator("formats")
    @classmethod
    def _unique(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"{v}: each format once")
        return v
