"""Request generators and trace replay, shared by the load client and the simulator."""

from __future__ import annotations

from heddle.workloads.agent import SUBAGENTS, USER_TURN, AgentCall, AgentProgram, ToolTime
from heddle.workloads.agent_bfcl import bfcl_agent
from heddle.workloads.agent_fanout import fanout_agent
from heddle.workloads.agent_generic import agent
from heddle.workloads.agent_run import AgentRun, ContextBuilder, TokenContexts
from heddle.workloads.agent_swe import swe_agent
from heddle.workloads.arrivals import (
    ARRIVAL_PROCESSES,
    all_at_once,
    arrival_times,
    gamma,
    poisson,
)
from heddle.workloads.registry import GENERATORS, Workload, get_workload, list_workloads
from heddle.workloads.request import DEFAULT_LOW_ID, WorkloadRequest, synthetic_prompt_ids
from heddle.workloads.synthetic import (
    chat,
    long_prompt_mix,
    multi_tenant,
    random_workload,
    reasoning_mix,
)
from heddle.workloads.traces import (
    TRACE_FILES,
    load_jsonl,
    read_csv,
    replay,
    save_jsonl,
    trace,
    trace_path,
)

__all__ = [
    "ARRIVAL_PROCESSES",
    "DEFAULT_LOW_ID",
    "GENERATORS",
    "SUBAGENTS",
    "TRACE_FILES",
    "USER_TURN",
    "AgentCall",
    "AgentProgram",
    "AgentRun",
    "ContextBuilder",
    "TokenContexts",
    "ToolTime",
    "Workload",
    "WorkloadRequest",
    "agent",
    "all_at_once",
    "arrival_times",
    "bfcl_agent",
    "chat",
    "fanout_agent",
    "gamma",
    "get_workload",
    "list_workloads",
    "load_jsonl",
    "long_prompt_mix",
    "multi_tenant",
    "poisson",
    "random_workload",
    "read_csv",
    "reasoning_mix",
    "replay",
    "save_jsonl",
    "swe_agent",
    "synthetic_prompt_ids",
    "trace",
    "trace_path",
]
