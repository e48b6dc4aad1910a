"""The grammar state of every constrained sequence, owned by the engine and keyed by request id.

Each step, `start_step` fills the token bitmask of the step's constrained sampling rows on a
worker thread (xgrammar's matchers release the GIL), so the work overlaps the forward pass;
the executor waits for it just before sampling. After the step, `accept` advances a matcher by
the tokens the scheduler kept. A matcher only ever advances on accepted output tokens, and
preemption by recompute keeps a request's output tokens, so a preempted request's matcher is
already in the right state when it resumes; a token sampled for a request that was preempted
or finished while the step ran is never accepted.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import xgrammar as xgr

from heddle.structured.compiler import GrammarCompiler
from heddle.structured.spec import GrammarSpec
from heddle.structured.step import GrammarStep


@dataclass(slots=True)
class _Entry:
    matcher: xgr.GrammarMatcher
    num_accepted: int = 0  # output tokens the matcher has consumed


class GrammarMatchers:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.vocab_size = compiler.vocab_size
        self._entries: dict[str, _Entry] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def add(self, request_id: str, grammar: GrammarSpec | xgr.CompiledGrammar) -> None:
        """A matcher for `request_id` (a spec is compiled first: InvalidRequestError if bad)."""
        if isinstance(grammar, GrammarSpec):
            grammar = self.compiler.compile(grammar)
        self._entries[request_id] = _Entry(xgr.GrammarMatcher(grammar))

    def remove(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def num_accepted(self, request_id: str) -> int:
        return self._entries[request_id].num_accepted

    def is_terminated(self, request_id: str) -> bool:
        return self._entries[request_id].matcher.is_terminated()

    # -- one step ----------------------------------------------------------------------------
    def start_step(self, request_ids: list[str], overlap: bool = True) -> GrammarStep:
        """The step's bitmask for `request_ids`, filled on the worker thread (or now)."""
        matchers = [self._entries[r].matcher for r in request_ids]
        future: Future[torch.Tensor]
        if overlap:
            future = self._worker().submit(self._fill, matchers)
        else:
            future = Future()
            future.set_result(self._fill(matchers))
        return GrammarStep(list(request_ids), future)

    def _fill(self, matchers: list[xgr.GrammarMatcher]) -> torch.Tensor:
        # [rows, ceil(vocab / 32)] int32, all bits set: a terminated matcher leaves its row open
        bitmask = xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for row, matcher in enumerate(matchers):
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, row)
        return bitmask

    def accept(self, request_id: str, output_token_ids: list[int]) -> bool:
        """Advance by the output tokens not yet consumed; False if the grammar rejects one."""
        entry = self._entries[request_id]
        for token_id in output_token_ids[entry.num_accepted :]:
            if entry.matcher.is_terminated() or not entry.matcher.accept_token(token_id):
                return False
            entry.num_accepted += 1
        return True

    def _worker(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="heddle-grammar")
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
