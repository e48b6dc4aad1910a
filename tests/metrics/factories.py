"""Hand-built records for metrics tests."""

from __future__ import annotations

from heddle.metrics import RequestRecord


def make_record(
    request_id: str,
    arrival: float,
    first_scheduled: float | None,
    token_times: list[float],
    finish: float | None,
    *,
    request_class: str = "default",
    user: str | None = None,
    reason: str | None = "length",
    prompt: int = 10,
    **kwargs: object,
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        arrival_time=arrival,
        num_prompt_tokens=prompt,
        request_class=request_class,
        user=user,
        first_scheduled_time=first_scheduled,
        first_token_time=token_times[0] if token_times else None,
        token_times=list(token_times),
        finish_time=finish,
        finish_reason=reason if finish is not None else None,
        **kwargs,  # type: ignore[arg-type]
    )
