"""One run of an agent workload: which calls come next, when they arrive, what their context is.

The simulator's event loop (heddle/engine/replay.py) and the load client (heddle/bench/agents.py)
drive programs through the same AgentRun, so a program has the same shape everywhere: the same
calls, output lengths, tool results, pauses, fan-outs and joins. They differ only in how a
context is written down, which a `ContextBuilder` decides: token ids for an engine
(`TokenContexts`), chat messages for an OpenAI-compatible server (heddle.bench.agents).

    run = AgentRun(workload, TokenContexts(vocab_size))
    for request in run.first_requests(): ...            # root programs' first calls
    follow_ups = run.finished(request, finish_time, output_ids)   # what that finish causes
    run.program_records()                               # one ProgramRecord per root program
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from heddle.errors import HeddleError
from heddle.metrics.programs import ProgramRecord
from heddle.workloads.agent import AgentProgram
from heddle.workloads.registry import Workload
from heddle.workloads.request import DEFAULT_LOW_ID, WorkloadRequest

C = TypeVar("C")  # a context: what a call's prompt holds
Out = TypeVar("Out")  # a call's output as the driver saw it
OutIn = TypeVar("OutIn", contravariant=True)


class ContextBuilder(Protocol[C, OutIn]):
    """How a driver writes contexts down. `size` and `output_len` are token counts (None when
    only the server knows, e.g. for text)."""

    def first(self, program: AgentProgram, request: WorkloadRequest) -> C: ...

    def after(self, program: AgentProgram, call_index: int, context: C, output: OutIn) -> C:
        """The context of call `call_index` of `program`: the previous call's context + its
        output + what call `call_index` adds (a tool result or the user's next message)."""
        ...

    def fork(self, child: AgentProgram, context: C, output: OutIn) -> C:
        """A sub-agent's first context: its parent's context + output + the child's task."""
        ...

    def join(
        self,
        program: AgentProgram,
        call_index: int,
        context: C,
        output: OutIn,
        results: Sequence[tuple[AgentProgram, OutIn]],
    ) -> C:
        """The context of the call after a fan-out: the parent's context + output + each
        child's final output + what call `call_index` adds."""
        ...

    def size(self, context: C) -> int | None: ...

    def output_len(self, output: OutIn) -> int | None: ...


class TokenContexts:
    """Contexts as token ids (the engine's view); outputs are the generated ids."""

    def __init__(self, vocab_size: int, low: int = DEFAULT_LOW_ID, high: int | None = None):
        self.vocab_size = vocab_size
        self.low = low
        self.high = high

    def first(self, program: AgentProgram, request: WorkloadRequest) -> tuple[int, ...]:
        return request.prompt_ids(self.vocab_size, self.low, self.high)

    def _extra(self, program: AgentProgram, call_index: int) -> tuple[int, ...]:
        return program.extra_ids(call_index, self.vocab_size, self.low, self.high)

    def after(
        self,
        program: AgentProgram,
        call_index: int,
        context: tuple[int, ...],
        output: Sequence[int],
    ) -> tuple[int, ...]:
        return context + tuple(output) + self._extra(program, call_index)

    def fork(
        self, child: AgentProgram, context: tuple[int, ...], output: Sequence[int]
    ) -> tuple[int, ...]:
        return context + tuple(output) + self._extra(child, 0)

    def join(
        self,
        program: AgentProgram,
        call_index: int,
        context: tuple[int, ...],
        output: Sequence[int],
        results: Sequence[tuple[AgentProgram, Sequence[int]]],
    ) -> tuple[int, ...]:
        joined = context + tuple(output)
        for _, result in results:
            joined += tuple(result)
        return joined + self._extra(program, call_index)

    def size(self, context: tuple[int, ...]) -> int:
        return len(context)

    def output_len(self, output: Sequence[int]) -> int:
        return len(output)


@dataclass(slots=True)
class _Join:
    """A fan-out waiting for its sub-agents."""

    parent: AgentProgram
    call_index: int  # the parent's call that fanned out
    context: Any
    output: Any
    request: WorkloadRequest
    children: list[AgentProgram]
    results: dict[str, Any] = field(default_factory=dict)  # child id -> final output
    started: float = 0.0  # when the parent's call finished and the children were sent
    finish_time: float = 0.0  # the latest child finish so far
    output_len: int = 0  # the parent call's output length plus the children's so far


class AgentRun(Generic[C, Out]):
    """The progress of one run through a workload's programs (see the module docstring)."""

    def __init__(self, workload: Workload, builder: ContextBuilder[C, Out]) -> None:
        if not workload.is_agent:
            raise HeddleError(f"workload {workload.name} has no agent programs")
        self.workload = workload
        self.builder = builder
        self._programs: dict[str, AgentProgram] = {}
        for program in workload.programs:
            self._register(program)
        self._contexts: dict[str, Any] = {}  # request id -> its context
        self._joins: dict[str, _Join] = {}  # child program id -> its parent's fan-out
        self._records: dict[str, ProgramRecord] = {}
        self._failed_roots: set[str] = set()
        self._open_programs: dict[str, int] = {}  # root id -> programs of its tree not done

    def _register(self, program: AgentProgram) -> None:
        if program.program_id in self._programs:
            raise HeddleError(f"duplicate program id {program.program_id!r}")
        self._programs[program.program_id] = program
        for call in program.calls:
            for child in call.subagents:
                self._register(child)

    def program(self, program_id: str) -> AgentProgram:
        try:
            return self._programs[program_id]
        except KeyError:
            raise HeddleError(
                f"no program {program_id!r} in workload {self.workload.name}"
            ) from None

    def program_of(self, request: WorkloadRequest) -> AgentProgram:
        if request.program_id is None:
            raise HeddleError(f"request {request.request_id} belongs to no program")
        return self.program(request.program_id)

    def context_of(self, request: WorkloadRequest) -> C:
        """The context of a request this run made (or of a first call)."""
        context = self._contexts.get(request.request_id)
        if context is None:
            program = self.program_of(request)
            context = self.builder.first(program, request)
            self._contexts[request.request_id] = context
        return context

    def first_requests(self) -> list[WorkloadRequest]:
        """The first call of every root program, sorted by arrival (the workload's requests)."""
        for request in self.workload.requests:
            root = self.program_of(request)
            self._records.setdefault(
                root.program_id,
                ProgramRecord(root.program_id, request.arrival_time, root.request_class),
            )
            self._open_programs.setdefault(root.program_id, 1)
        return list(self.workload.requests)

    def record_of(self, program: AgentProgram) -> ProgramRecord:
        root = program.root_id
        record = self._records.get(root)
        if record is None:
            root_program = self.program(root)
            record = ProgramRecord(root, root_program.arrival_time, root_program.request_class)
            self._records[root] = record
            self._open_programs.setdefault(root, 1)
        return record

    def finished(
        self, request: WorkloadRequest, finish_time: float, output: Out
    ) -> list[WorkloadRequest]:
        """`request` finished at `finish_time` (seconds from the run's start) with `output`:
        the requests that causes, each with its arrival time (empty for none)."""
        program = self.program_of(request)
        record = self.record_of(program)
        record.num_calls += 1
        context = self.context_of(request)
        self._contexts.pop(request.request_id, None)
        if program.root_id in self._failed_roots:
            return []
        k = request.call_index
        if k == len(program.calls) - 1:
            self._program_done(program.root_id, finish_time)
            return self._child_done(program, request, finish_time, output)
        call = program.calls[k]
        if call.subagents:
            return self._fan_out(program, request, finish_time, context, output)
        next_context = self.builder.after(program, k + 1, context, output)
        arrival = finish_time + call.tool_latency_after
        if program.parent_id is None:  # the main thread's waits (a sub-agent's overlap them)
            record.tool_time += call.tool_latency_after
        out_len = self._output_len(output, request.output_len)
        return [self._make(program, k + 1, arrival, next_context, request, out_len)]

    def failed(self, request: WorkloadRequest, finish_time: float) -> None:
        """`request` failed: its whole program tree stops (nothing it would cause is sent)."""
        program = self.program_of(request)
        record = self.record_of(program)
        record.failed = True
        record.finish_time = finish_time
        self._failed_roots.add(program.root_id)
        self._contexts.pop(request.request_id, None)

    def program_records(self) -> list[ProgramRecord]:
        """One record per root program that started, in start order."""
        return sorted(self._records.values(), key=lambda r: (r.arrival_time, r.program_id))

    # -- internals ------------------------------------------------------------------------
    def _output_len(self, output: Any, planned: int) -> int:
        known = self.builder.output_len(output)
        return planned if known is None else known

    def _make(
        self,
        program: AgentProgram,
        call_index: int,
        arrival: float,
        context: Any,
        like: WorkloadRequest,
        added_output_len: int,
    ) -> WorkloadRequest:
        """The request of `program`'s call `call_index`, which follows `like` (the call before
        it, or the parent's call for a sub-agent's first); `added_output_len` tokens of output
        (that call's, and for a join the children's) went into `context`."""
        size = self.builder.size(context)
        if size is None:  # the server tokenizes: plan from the lengths we know
            size = like.prompt_len + added_output_len + program.calls[call_index].prompt_extra_len
        ids = context if isinstance(self.builder, TokenContexts) else None
        request = program.call_request(
            call_index, arrival, max(1, size), prompt_token_ids=ids, like=like
        )
        self._contexts[request.request_id] = context
        return request

    def _fan_out(
        self,
        program: AgentProgram,
        request: WorkloadRequest,
        finish_time: float,
        context: Any,
        output: Any,
    ) -> list[WorkloadRequest]:
        call = program.calls[request.call_index]
        out_len = self._output_len(output, request.output_len)
        join = _Join(
            program,
            request.call_index,
            context,
            output,
            request,
            list(call.subagents),
            started=finish_time,
            finish_time=finish_time,
            output_len=out_len,
        )
        arrival = finish_time + call.tool_latency_after
        self.record_of(program).num_subagents += len(call.subagents)
        root = program.root_id
        self._open_programs[root] = self._open_programs.get(root, 1) + len(call.subagents)
        requests = []
        for child in call.subagents:
            self._joins[child.program_id] = join
            child_context = self.builder.fork(child, context, output)
            requests.append(self._make(child, 0, arrival, child_context, request, out_len))
        return requests

    def _child_done(
        self, child: AgentProgram, request: WorkloadRequest, finish_time: float, output: Any
    ) -> list[WorkloadRequest]:
        join = self._joins.pop(child.program_id, None)
        if join is None:
            return []
        join.results[child.program_id] = output
        join.finish_time = max(join.finish_time, finish_time)
        join.output_len += self._output_len(output, request.output_len)
        if len(join.results) < len(join.children):
            return []
        parent, k = join.parent, join.call_index + 1
        results = [(c, join.results[c.program_id]) for c in join.children]
        context = self.builder.join(parent, k, join.context, join.output, results)
        if parent.parent_id is None:
            self.record_of(parent).tool_time += join.finish_time - join.started
        return [self._make(parent, k, join.finish_time, context, join.request, join.output_len)]

    def _program_done(self, root_id: str, finish_time: float) -> None:
        left = self._open_programs.get(root_id, 1) - 1
        self._open_programs[root_id] = left
        if left == 0:
            self._records[root_id].finish_time = finish_time
