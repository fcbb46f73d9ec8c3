"""Deterministic graphs for the langgraph provider tests: no model, no network.

``answer`` waits ``configurable.delay`` seconds (so a test can cancel or crash it mid-run) and
replies with a JSON answer; ``ask`` interrupts for a human and replies with the resume value;
``fail`` raises, so the provider's error path sees a real server-side failure.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import interrupt


def _last_text(state: MessagesState) -> str:
    return str(state["messages"][-1].content) if state["messages"] else ""


async def _answer(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    delay = float(config.get("configurable", {}).get("delay", 0.2))
    await asyncio.sleep(delay)
    reply = json.dumps({"answer": 42, "task": _last_text(state)})
    return {"messages": [AIMessage(content=reply)]}


def _ask(state: MessagesState) -> dict[str, Any]:
    reply = interrupt({"question": f"approve {_last_text(state)}?"})
    return {"messages": [AIMessage(content=f"human said: {reply}")]}


def _fail(state: MessagesState) -> dict[str, Any]:
    raise ValueError(f"deliberate failure for {_last_text(state)}")


def _single(name: str, node: Any) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node(name, node)
    graph.add_edge(START, name)
    graph.add_edge(name, END)
    return graph.compile()


answer = _single("answer", _answer)
ask = _single("ask", _ask)
fail = _single("fail", _fail)
