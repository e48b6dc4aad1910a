"""heddle: an LLM inference engine whose heart is its scheduler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heddle.request import SamplingParams

__all__ = ["LLM", "SamplingParams", "__version__"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from heddle.engine.llm import LLM


def __getattr__(name: str) -> Any:
    # LLM pulls in torch; keep `import heddle` light for the scheduler and the simulator.
    if name == "LLM":
        from heddle.engine.llm import LLM

        return LLM
    raise AttributeError(name)
