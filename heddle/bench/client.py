"""`heddle bench serve`: load any OpenAI-compatible server with a workload and report latency.

    result = run_bench("http://127.0.0.1:8000", "chat", request_rate=4, num_requests=200,
                       slo=SLO(ttft=0.5, tpot=0.05), output_dir="out")

Works against heddle, llama.cpp's llama-server, vLLM, ...: it only streams /v1/completions with
`max_tokens` = the workload's output length and `ignore_eos`, so every server generates the
same number of tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from heddle.bench.prompts import PROMPT_MODES
from heddle.bench.refusals import Answer, refusal_report
from heddle.bench.report import BenchResult, print_report, write_outputs
from heddle.bench.runner import LoadOptions, generate_load
from heddle.cli.flags import parse_key_values, parse_slo
from heddle.errors import HeddleError
from heddle.metrics import SLO, summarize
from heddle.metrics.summary import run_span
from heddle.workloads import ARRIVAL_PROCESSES, Workload, get_workload, list_workloads
from heddle.workloads.arrivals import arrival_arg


def api_root(base_url: str) -> str:
    """ "http://host:8000", ".../" and ".../v1" all mean the same server."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def build_workload(
    workload: str | Workload,
    *,
    num_requests: int | None,
    request_rate: float | None,
    concurrency: int | None,
    seed: int = 0,
    arrival: str | None = None,
    cv: float | None = None,
    options: dict[str, Any] | None = None,
) -> Workload:
    if isinstance(workload, Workload):
        return workload
    if request_rate is None and concurrency is None:
        raise HeddleError("give a request rate (open loop) or a concurrency (closed loop)")
    rate = math.inf if request_rate is None else request_rate
    kwargs: dict[str, Any] = {"seed": seed, "num_requests": num_requests, "rate": rate}
    if arrival is not None:
        kwargs["arrival"] = arrival
    if cv is not None:
        kwargs["cv"] = cv
    return get_workload(workload, **kwargs, **(options or {}))


async def discover_model(base_url: str, headers: dict[str, str]) -> str:
    """The first model the server lists at /v1/models."""
    url = f"{api_root(base_url)}/v1/models"
    try:
        async with httpx.AsyncClient(headers=headers, trust_env=False, timeout=30) as client:
            response = await client.get(url)
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise HeddleError(f"cannot list the models at {url} ({e}); pass --model") from e


async def run_bench_async(
    base_url: str,
    workload: str | Workload = "random",
    *,
    request_rate: float | None = None,
    concurrency: int | None = None,
    num_requests: int | None = 100,
    slo: SLO | None = None,
    model: str | None = None,
    prompt_mode: str = "tokens",
    vocab_size: int = 32000,
    max_duration: float | None = None,
    request_timeout: float | None = 300.0,
    api_key: str | None = None,
    seed: int = 0,
    arrival: str | None = None,
    cv: float | None = None,
    temperature: float = 0.0,
    workload_options: dict[str, Any] | None = None,
    extensions: bool = True,
    progress: bool = False,
    retry_refused: int = 0,
) -> BenchResult:
    """Run the load and summarize it (see run_bench)."""
    if prompt_mode not in PROMPT_MODES:
        raise HeddleError(f"unknown prompt mode {prompt_mode!r}; use {' or '.join(PROMPT_MODES)}")
    if concurrency is not None and concurrency < 1:
        raise HeddleError("concurrency must be at least 1")
    if max_duration is not None and max_duration <= 0:
        raise HeddleError("max duration must be positive")
    if retry_refused < 0:
        raise HeddleError("retries of refused requests must be >= 0")
    load = build_workload(
        workload,
        num_requests=num_requests,
        request_rate=request_rate,
        concurrency=concurrency,
        seed=seed,
        arrival=arrival,
        cv=cv,
        options=workload_options,
    )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model = model or await discover_model(base_url, headers)
    options = LoadOptions(
        url=f"{api_root(base_url)}/v1/completions",
        model=model,
        prompt_mode=prompt_mode,
        vocab_size=vocab_size,
        concurrency=concurrency,
        max_duration=max_duration,
        request_timeout=request_timeout,
        temperature=temperature,
        extensions=extensions,
        headers=headers,
        retry_refused=retry_refused,
    )
    if load.is_agent:
        if retry_refused:
            raise HeddleError(
                "the agent client does not send refused calls again: --retry-refused is for "
                "non-agent workloads"
            )
        return await _run_agents(
            base_url,
            load,
            model,
            headers,
            slo,
            progress,
            concurrency,
            request_rate,
            max_duration=max_duration,
            request_timeout=request_timeout,
            temperature=temperature,
            seed=seed,
            extensions=extensions,
        )
    total = len(load.flat())
    if progress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("[bold]bench[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
        )
        with Progress(*columns) as bar:
            task = bar.add_task("requests", total=total, failed=0)
            failed = 0

            def advance(outcome: Any) -> None:
                nonlocal failed
                failed += outcome.error is not None
                bar.update(task, advance=1, failed=failed)

            result = await generate_load(load, options, advance)
    else:
        result = await generate_load(load, options)
    answers = _answers(result.outcomes, slo, retry_refused)
    config = {
        "base_url": base_url,
        "model": model,
        "workload": load.name,
        "request_rate": request_rate,
        "concurrency": concurrency,
        "num_requests": total,
        "prompt_mode": prompt_mode,
        "max_duration": max_duration,
        "request_timeout": request_timeout,
        "temperature": temperature,
        "retry_refused": retry_refused,
        "slo": None if slo is None else {"ttft": slo.ttft, "tpot": slo.tpot},
    }
    return BenchResult(
        config=config,
        workload=load.describe(),
        summary=summarize(answers["records"], slo=slo),
        num_not_sent=result.num_not_sent,
        wall_time=result.wall_time,
        workload_requests=load.flat(),
        **answers,
    )


def _answers(outcomes: Sequence[Answer], slo: SLO | None, retry_refused: int) -> dict[str, Any]:
    """The records, errors and refusals of a run, for both clients (completions, agents' chat).

    Refused requests (HTTP 429) are load the server chose not to take: not records of the
    summary, not errors; their own report counts them as offered (heddle.bench.refusals)."""
    return {
        "records": [o.record for o in outcomes if not o.refused],
        "errors": {
            o.record.request_id: o.error for o in outcomes if o.error is not None and not o.refused
        },
        "refusals": refusal_report(
            outcomes, run_span(o.record for o in outcomes), slo, retry_refused
        ),
        "refused": [
            {
                "request_id": o.record.request_id,
                "request_class": o.record.request_class,
                "arrival_time": o.record.arrival_time,
                "num_refusals": o.num_refusals,
                "retry_after": o.retry_after,
                "message": o.error,
            }
            for o in outcomes
            if o.refused
        ],
    }


async def _run_agents(
    base_url: str,
    load: Workload,
    model: str,
    headers: dict[str, str],
    slo: SLO | None,
    progress: bool,
    concurrency: int | None,
    request_rate: float | None,
    **kwargs: Any,
) -> BenchResult:
    """An agent workload: its programs as chat conversations (heddle.bench.agents)."""
    from heddle.bench.agents import AgentLoadOptions, run_programs
    from heddle.metrics.programs import summarize_programs

    options = AgentLoadOptions(
        url=f"{api_root(base_url)}/v1/chat/completions",
        model=model,
        concurrency=concurrency,
        headers=headers,
        **kwargs,
    )
    total = len(load.flat())
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        columns = (TextColumn("[bold]agents[/bold] calls"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns) as bar:
            task = bar.add_task("calls", total=total)
            result = await run_programs(load, options, lambda _: bar.update(task, advance=1))
    else:
        result = await run_programs(load, options)
    # A refused call (HTTP 429) ends its program, as an error does, but counts as a refusal.
    # The agent client does not send a refused call again (retry_refused 0).
    answers = _answers(result.outcomes, slo, 0)
    records = answers["records"]
    config = {
        "base_url": base_url,
        "model": model,
        "workload": load.name,
        "request_rate": request_rate,
        "concurrency": concurrency,
        "num_programs": len(load.programs),
        "num_requests": total,
        "api": "chat",
        "max_duration": options.max_duration,
        "request_timeout": options.request_timeout,
        "temperature": options.temperature,
        "extensions": options.extensions,
        "slo": None if slo is None else {"ttft": slo.ttft, "tpot": slo.tpot},
    }
    return BenchResult(
        config=config,
        workload=load.describe(),
        summary=summarize(records, slo=slo),
        num_not_sent=result.num_not_sent,
        wall_time=result.wall_time,
        workload_requests=load.flat(),
        program_records=result.programs,
        programs=summarize_programs(result.programs, records, cache_reported=result.cache_reported),
        **answers,
    )


def run_bench(
    base_url: str,
    workload: str | Workload = "random",
    *,
    output_dir: str | Path | None = None,
    label: str = "bench",
    **kwargs: Any,
) -> BenchResult:
    """Load `base_url` with `workload` and return the records and their summary.

    Open loop with `request_rate` (requests/s; arrivals from the workload: `arrival` "poisson"
    or "gamma" with `cv`), closed loop with `concurrency`, or both. Bounded by `num_requests`
    and `max_duration` seconds; each request by `request_timeout`. With `output_dir`, writes
    `<label>.json` and `<label>_cdf.png` there. Other keyword arguments: see run_bench_async.
    """
    result = asyncio.run(run_bench_async(base_url, workload, **kwargs))
    if output_dir is not None:
        write_outputs(result, output_dir, label)
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `heddle bench serve`."""
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root URL")
    parser.add_argument(
        "--workload", default="random", help=f"{', '.join(list_workloads())} or a .jsonl/.csv"
    )
    parser.add_argument(
        "--workload-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the workload generator, e.g. input_len=256 (repeatable)",
    )
    load = parser.add_argument_group("load (give a rate, a concurrency, or both)")
    load.add_argument("--request-rate", type=float, default=None, help="open loop: requests/s")
    load.add_argument("--concurrency", type=int, default=None, help="closed loop: in flight")
    load.add_argument(
        "--arrival",
        type=arrival_arg,
        default=None,
        help=f"{', '.join(ARRIVAL_PROCESSES)}; profiles take options: burst:peak=3,calm=0.7",
    )
    load.add_argument("--cv", type=float, default=None, help="gamma arrivals: burstiness")
    load.add_argument("--num-requests", type=int, default=100)
    load.add_argument("--max-duration", type=float, default=None, help="seconds, then stop")
    load.add_argument("--request-timeout", type=float, default=300.0, help="seconds")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument(
        "--retry-refused",
        type=int,
        default=0,
        metavar="N",
        help="send a refused request (HTTP 429) again after its Retry-After, up to N times",
    )
    req = parser.add_argument_group("requests")
    req.add_argument("--model", default=None, help="model name (default: the server's first)")
    req.add_argument("--api-key", default=None)
    req.add_argument("--prompt-mode", choices=PROMPT_MODES, default="tokens")
    req.add_argument("--vocab-size", type=int, default=32000, help="token prompts: ids below")
    req.add_argument("--temperature", type=float, default=0.0)
    req.add_argument(
        "--no-extensions", action="store_true", help="never send heddle's extra fields"
    )
    out = parser.add_argument_group("report")
    out.add_argument("--slo", default=None, help="goodput targets, e.g. ttft=0.5,tpot=0.05")
    out.add_argument("--output-dir", default=None, help="write <label>.json and a CDF PNG")
    out.add_argument("--label", default="bench", help="file name stem of the outputs")
    out.add_argument("--no-progress", action="store_true")


def run_from_args(args: argparse.Namespace) -> int:
    """`heddle bench serve`: run, print the table, write outputs. Returns the exit status
    (1 when no request completed). Raises HeddleError for bad options."""
    result = run_bench(
        args.base_url,
        args.workload,
        output_dir=args.output_dir,
        label=args.label,
        request_rate=args.request_rate,
        concurrency=args.concurrency,
        num_requests=args.num_requests,
        slo=parse_slo(args.slo),
        model=args.model,
        prompt_mode=args.prompt_mode,
        vocab_size=args.vocab_size,
        max_duration=args.max_duration,
        request_timeout=args.request_timeout,
        api_key=args.api_key,
        seed=args.seed,
        arrival=args.arrival,
        cv=args.cv,
        temperature=args.temperature,
        workload_options=parse_key_values(args.workload_option, "--workload-option"),
        extensions=not args.no_extensions,
        progress=not args.no_progress,
        retry_refused=args.retry_refused,
    )
    print_report(result)
    if args.output_dir:
        print(f"wrote {Path(args.output_dir) / args.label}.json and {args.label}_cdf.png")
    return 0 if result.summary.overall.num_completed else 1
