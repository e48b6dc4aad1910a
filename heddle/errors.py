"""Errors a user can cause. Each carries a one-line message fit for a CLI or an HTTP 4xx body."""

from __future__ import annotations


class HeddleError(Exception):
    """Base class for errors caused by user input; never shown as a traceback."""


class ModelLoadError(HeddleError):
    """A model path that does not exist or is not a model heddle can load."""


class ModelNotFoundError(ModelLoadError):
    """No model where one was looked for (e.g. the embedded model's package is not installed)."""


class InvalidRequestError(HeddleError):
    """A request the engine cannot serve: bad sampling parameters, prompt too long, ..."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class QueueFullError(HeddleError):
    """The waiting queue is at its bound, or admission control refused the request as one that
    cannot be served in time; the caller should retry later (HTTP 429 with Retry-After)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        reason: str = "queue_full",
        request_class: str | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds; None: no estimate
        self.reason = reason
        self.request_class = request_class
