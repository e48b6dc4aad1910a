"""Structured decoding: a request's grammar, compiled once per grammar, matched per sequence.

`GrammarSpec` (torch-free) is what a request carries and what the scheduler and policies see.
`GrammarCompiler` (xgrammar) compiles specs for one tokenizer, with a cache; `GrammarMatchers`
holds each constrained sequence's matcher and fills the step's token bitmask, off the engine
thread while the forward pass runs (`GrammarStep`).
"""

from heddle.structured.spec import GrammarKind, GrammarSpec
from heddle.structured.step import GrammarStep

__all__ = ["GrammarKind", "GrammarSpec", "GrammarStep"]
