"""One resumer as a process: resumes a paused refund thread with
Command(resume="approve") and prints one JSON line with what it saw.

    python resume.py --dsn DSN --thread T --mandate M [--guarded] [--barrier NAME:N] [--hang] [--aio]

--guarded takes the gateway from MANDATED_GATEWAY_URL, MANDATED_GATEWAY_TOKEN
and MANDATED_GATEWAY_ORG. --hang blocks forever inside the effect, after the
provider wrote its ledger row and before the commit (for kill -9).
"""

import argparse
import asyncio
import json
import os
import sys
import threading

from approval import Barrier, Provider, build_async_graph, build_graph
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command

import mandated
import mandated.aio
from mandated.aio.langgraph import Guard as AsyncGuard
from mandated.langgraph import Guard


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--thread", required=True)
    p.add_argument("--mandate", default="")
    p.add_argument("--guarded", action="store_true")
    p.add_argument("--barrier", default="")
    p.add_argument("--hang", action="store_true")
    p.add_argument("--aio", action="store_true", help="ainvoke with the async guard and AsyncPostgresSaver")
    a = p.parse_args()
    if a.aio:
        return asyncio.run(resume_async(a))
    guard = None
    if a.guarded:
        gw = mandated.Client(os.environ["MANDATED_GATEWAY_URL"], os.environ["MANDATED_GATEWAY_TOKEN"],
                             os.environ["MANDATED_GATEWAY_ORG"], timeout=60)
        guard = Guard(gw, a.mandate, operation="payment.refund")
    barrier = None
    if a.barrier:
        name, n = a.barrier.rsplit(":", 1)
        barrier = Barrier(a.dsn, name, int(n))
    provider = Provider(a.dsn)
    on_effect = None
    if a.hang:
        def on_effect(provider_key):
            provider.refund("hang-" + a.thread, 1, provider_key)  # the effect happened...
            print(json.dumps({"executing": provider_key}), flush=True)
            threading.Event().wait()  # ...and the commit never comes: kill -9 here
    with PostgresSaver.from_conn_string(a.dsn) as saver:
        graph = build_graph(saver, provider, guard, barrier, on_effect)
        try:
            out = graph.invoke(Command(resume="approve"), {"configurable": {"thread_id": a.thread}})
        except mandated.MandatedError as err:
            print(json.dumps({"error": type(err).__name__, "message": str(err)}), flush=True)
            return 3
    print(json.dumps({"status": out.get("status"), "refund": out.get("refund")}), flush=True)
    return 0


async def resume_async(a: argparse.Namespace) -> int:
    gw = mandated.aio.Client(os.environ["MANDATED_GATEWAY_URL"], os.environ["MANDATED_GATEWAY_TOKEN"],
                             os.environ["MANDATED_GATEWAY_ORG"], timeout=60)
    guard = AsyncGuard(gw, a.mandate, operation="payment.refund")
    async with AsyncPostgresSaver.from_conn_string(a.dsn) as saver:
        graph = build_async_graph(saver, Provider(a.dsn), guard)
        try:
            out = await graph.ainvoke(Command(resume="approve"), {"configurable": {"thread_id": a.thread}})
        except mandated.MandatedError as err:
            print(json.dumps({"error": type(err).__name__, "message": str(err)}), flush=True)
            return 3
    print(json.dumps({"status": out.get("status"), "refund": out.get("refund")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
