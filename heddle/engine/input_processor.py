"""Input processing: a client request checked against the model and turned into the
scheduler's `Request`s (n of them when sampling params ask for n > 1)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from heddle.errors import InvalidRequestError
from heddle.request import Request, SamplingParams


class InputProcessor:
    """Validates prompts and parameters, fans out n > 1, and fills in the engine's defaults."""

    def __init__(
        self,
        *,
        eos_token_id: int | None = None,
        max_model_len: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise InvalidRequestError for a request this engine cannot serve."""
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt must contain at least one token", "prompt")
        if self.vocab_size is not None:
            vocab = self.vocab_size
            # min and max run in C; the list of bad ids is built only for the message.
            if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
                bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
                raise InvalidRequestError(
                    f"token id {bad[0]} is outside the vocabulary (size {vocab})", "prompt"
                )
        limit = self.max_model_len
        if limit is not None:
            if len(prompt_token_ids) >= limit:
                raise InvalidRequestError(
                    f"the prompt has {len(prompt_token_ids)} tokens; this model's context is "
                    f"{limit} tokens and at least one must be left to generate",
                    "prompt",
                )
            if params.max_tokens is not None and len(prompt_token_ids) + params.max_tokens > limit:
                raise InvalidRequestError(
                    f"max_tokens={params.max_tokens} plus the prompt's {len(prompt_token_ids)} "
                    f"tokens exceeds this model's context of {limit} tokens",
                    "max_tokens",
                )

    def make_requests(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        **fields: Any,
    ) -> list[Request]:
        """The sequences of one client request: `request_id` alone, or `<id>-0` .. `<id>-(n-1)`
        for n > 1 (each seeded `seed + index` when a seed is set; the later ones wait for the
        first one's prompt, then share its blocks through the prefix cache)."""
        self.validate(prompt_token_ids, params)
        requests: list[Request] = []
        parent_id: str | None = None
        for index in range(params.n):
            seq_params = params
            if params.n > 1 and params.seed is not None:
                seq_params = replace(params, seed=params.seed + index)
            seq_id = request_id if params.n == 1 else f"{request_id}-{index}"
            requests.append(
                Request(
                    request_id=seq_id,
                    prompt_token_ids=list(prompt_token_ids),
                    sampling_params=seq_params,
                    arrival_time=arrival_time,
                    eos_token_id=self.eos_token_id,
                    max_model_len=self.max_model_len,
                    parent_request_id=parent_id,
                    **fields,
                )
            )
            parent_id = parent_id or seq_id
        return requests
