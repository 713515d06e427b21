"""An agent written with the official Python MCP SDK (PyPI: mcp), calling
mandate-mcp over streamable HTTP. Used by TestPythonAgent: it prints one JSON
object with what each call returned, and the Go test judges it.

usage: agent.py URL CASE_ID ORDER_ID
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def view(res):
    text = "\n".join(c.text for c in res.content if getattr(c, "type", "") == "text")
    meta = res.meta or {}
    return {
        "is_error": res.is_error,
        "text": text,
        "structured": res.structured_content,
        "outcome": meta.get("io.mandated/outcome"),
        "reason": meta.get("io.mandated/reason"),
        "decision_id": meta.get("io.mandated/decision_id"),
    }


async def call(url, name, arguments, meta):
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return view(await session.call_tool(name, arguments, meta=meta))


async def main(url, case_id, order_id):
    args = {"case_id": case_id, "order_id": order_id, "amount_cents": 1200, "reference": "py-ref-1"}
    meta = {"run_id": "py-run-1", "step": "refund"}
    out = {}
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            out["tools"] = sorted(t.name for t in tools.tools)
    # Eight workers resume the same step at once, each with its own session.
    out["concurrent"] = await asyncio.gather(*(call(url, "refund", args, meta) for _ in range(8)))
    # The agent is restored from a checkpoint: a regenerated reference, the same run and step.
    restored = dict(args, reference="py-ref-regenerated")
    out["restored"] = await call(url, "refund", restored, meta)
    # Another step of the run wants a second refund: the mandate allows one.
    out["second_step"] = await call(url, "refund", dict(args, reference="py-ref-2"), {"run_id": "py-run-1", "step": "refund-again"})
    # Arguments that fail the tool's schema.
    out["bad_arguments"] = await call(url, "refund", dict(args, amount_cents="twelve euros"), meta)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
