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
    """The waiting queue is at its bound; the caller should retry later (HTTP 429)."""
