"""The OpenAI Agents SDK runs a two-tool task against `heddle serve` (its engine core in its own
process), unmodified.

The SDK speaks the Responses API by default; `OpenAIChatCompletionsModel` is its model class
for Chat Completions servers. SmolLM2-135M does not choose tools on its own, so each step
names the tool it must call (`tool_choice`), and the SDK carries the conversation — the call,
its arguments parsed into the Python function's parameters, the tool's output — from one run
into the next. The last run answers in text from that history.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from heddle.engine.core_client import CoreClient
from heddle.engine.core_process import engine_from_config
from tests.server.live import LiveServer, core_config, shared_executor

agents = pytest.importorskip("agents")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    # What `heddle serve` runs: the engine core in its own process. The conversation carries
    # the tool definitions three times over: a longer context.
    shared_executor()  # skips the module when the embedded model is not installed
    config = core_config(max_model_len=2048, max_num_seqs=4)
    client = CoreClient(functools.partial(engine_from_config, config))
    client.start()
    live = LiveServer(client=client).start()
    yield live
    live.stop()
    client.shutdown()


def test_agent_calls_two_tools_and_answers(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
    )
    from openai import AsyncOpenAI

    called: list[tuple[str, object]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current temperature in a city, in degrees Celsius."""
        called.append(("get_weather", city))
        return "21"

    @function_tool
    def to_fahrenheit(celsius: float) -> str:
        """Convert a temperature from Celsius to Fahrenheit."""
        called.append(("to_fahrenheit", celsius))
        return f"{celsius * 9 / 5 + 32:.1f}"

    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    model = OpenAIChatCompletionsModel(model="SmolLM2-135M-Instruct", openai_client=client)
    tools = [get_weather, to_fahrenheit]
    config = RunConfig(tracing_disabled=True)

    def agent(tool_choice: str) -> Agent:
        return Agent(
            name="weather",
            instructions="You answer questions about the weather with the tools you have.",
            model=model,
            tools=tools,
            model_settings=ModelSettings(tool_choice=tool_choice, temperature=0, max_tokens=60),
            tool_use_behavior="stop_on_first_tool",
        )

    async def run() -> str:
        first = await Runner.run(agent("get_weather"), "How warm is it in Paris?",
                                 run_config=config, max_turns=3)
        history = [*first.to_input_list(),
                   {"role": "user", "content": "Convert that to Fahrenheit."}]
        second = await Runner.run(agent("to_fahrenheit"), history, run_config=config,
                                  max_turns=3)
        history = [*second.to_input_list(),
                   {"role": "user", "content": "So how warm is it, in one sentence?"}]
        final = await Runner.run(agent("none"), history, run_config=config, max_turns=2)
        return str(final.final_output)

    answer = asyncio.run(run())
    assert [name for name, _ in called] == ["get_weather", "to_fahrenheit"]
    assert isinstance(called[0][1], str) and isinstance(called[1][1], float)
    assert answer.strip()
    server.assert_pool_whole()
