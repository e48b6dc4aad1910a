"""InputProcessor's checks: the vocabulary bound names the first id outside it."""

from __future__ import annotations

import pytest

from heddle.engine.input_processor import InputProcessor
from heddle.errors import InvalidRequestError
from heddle.request import SamplingParams


@pytest.mark.parametrize(
    ("prompt", "bad"), [([1, 12, -1], 12), ([3, -1, 40], -1), ([9, 10], 10), ([0, 9], None)]
)
def test_vocabulary_bound(prompt: list[int], bad: int | None) -> None:
    inputs = InputProcessor(vocab_size=10)
    if bad is None:
        inputs.validate(prompt, SamplingParams())
        return
    with pytest.raises(InvalidRequestError, match=f"token id {bad} is outside the vocabulary"):
        inputs.validate(prompt, SamplingParams())
