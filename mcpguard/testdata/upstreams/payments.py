"""The payments MCP server of mcpguard's upstream matrix, written with the
official Python MCP SDK (PyPI: mcp): MCPServer in mcp 2.x, FastMCP in 1.x.

refund appends one line to the ledger file (MCP_TEST_LEDGER) every time it
runs, and never deduplicates: the ledger is the truth of how often it ran.
Its return type is annotated, so the SDK declares an output schema and
answers structured content, as FastMCP does for every annotated return.

usage: payments.py stdio | payments.py http PORT
"""

import json
import os
import sys
import time

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as Server
    SDK = "mcpserver"
except ModuleNotFoundError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server
    SDK = "fastmcp"

from pydantic import BaseModel

LEDGER = os.environ["MCP_TEST_LEDGER"]

server = Server("payments")


class Refund(BaseModel):
    ledger_id: int
    order_id: str
    amount_cents: int
    note: str = ""


def _append(record):
    # O_APPEND: one write per line, so concurrent runs never interleave.
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
    with open(LEDGER) as f:
        return sum(1 for _ in f)


@server.tool()
async def refund(case_id: str, order_id: str, amount_cents: int, reference: str, pad: int = 0, hold: str = "") -> Refund:
    """Refunds an order. Cannot be undone."""
    if reference == "card-declined":
        raise ValueError("card declined")
    ledger_id = _append({"order_id": order_id, "amount_cents": amount_cents, "reference": reference, "pid": os.getpid()})
    if hold:
        # A busy upstream: the refund is written and the answer waits until
        # the file named hold exists, holding the event loop (as a sync tool
        # does in FastMCP 1.x), so the server answers nothing else meanwhile,
        # pings included. Bounded: 120 s.
        deadline = time.monotonic() + 120
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)
    return Refund(ledger_id=ledger_id, order_id=order_id, amount_cents=amount_cents, note="\u00e9" * (pad // 2))


@server.tool()
def balance(order_id: str) -> int:
    """Counts the refunds of an order."""
    try:
        with open(LEDGER) as f:
            return sum(1 for line in f if json.loads(line)["order_id"] == order_id)
    except FileNotFoundError:
        return 0


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_STARTS"):  # one line per process started
        fd = os.open(os.environ["MCP_TEST_STARTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"%d\n" % os.getpid())
        os.close(fd)
    if sys.argv[1] == "stdio":
        server.run("stdio")
    elif SDK == "mcpserver":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.settings.host, server.settings.port = "127.0.0.1", int(sys.argv[2])
        server.run("streamable-http")
