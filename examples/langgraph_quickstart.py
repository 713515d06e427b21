"""The README's LangGraph snippet as a program, against `make dev`:

    source .infra/dev/env
    pip install "./clients/python[langgraph]"
    python3 examples/langgraph_quickstart.py

It spends mandate refund-case-1843 (one refund of at most 200.00 EUR to
customer-77) from a graph that pauses in interrupt() for approval. The
checkpointer is PostgreSQL (MANDATED_DATABASE_URL, as make dev sets it) or,
without it, in memory. Run it twice: the thread is the same, so the second
run resumes nothing new and prints the same recorded refund — one refund.
"""

import os
import uuid

import mandated

gw = mandated.Client(os.environ["MANDATED_GATEWAY_URL"], os.environ["MANDATED_GATEWAY_TOKEN"], "acme")


class Provider:
    """Stands in for your payment provider: provider_key is its idempotency key."""

    def refund(self, order_id, amount, provider_key):
        ref = "re_" + uuid.uuid5(uuid.NAMESPACE_URL, provider_key).hex[:12]
        return mandated.Effect(external_ref=ref, result={"refund_id": ref, "order_id": order_id, "amount": amount})


provider = Provider()


def main(checkpointer):
    from typing import TypedDict

    from langgraph.graph import START, StateGraph
    from langgraph.types import Command, interrupt

    from mandated.langgraph import Guard

    guard = Guard(gw, "refund-case-1843", operation="payment.refund")

    class Refund(TypedDict, total=False):
        order_id: str
        customer: str
        amount: int
        status: str
        refund: dict

    def refund(state: Refund) -> Refund:
        if interrupt({"approve": state["order_id"]}) != "approve":  # paused for a person
            return {"status": "rejected"}
        ex = guard.execute(lambda provider_key: provider.refund(state["order_id"], state["amount"], provider_key),
                           amount=state["amount"], currency="EUR", target=state["customer"])
        return {"status": "refunded", "refund": ex.result}  # the winner's recorded result, in every resumer

    g = StateGraph(Refund)
    g.add_node("refund", refund)
    g.add_edge(START, "refund")
    app = g.compile(checkpointer=checkpointer)
    cfg = {"configurable": {"thread_id": "case-1843"}}
    if not app.get_state(cfg).values:  # a new thread: it pauses for approval
        print(app.invoke({"order_id": "order-1843", "customer": "customer-77", "amount": 15000}, cfg)["__interrupt__"])
    state = app.get_state(cfg)
    out = app.invoke(Command(resume="approve"), cfg) if state.next else state.values  # resumed once; then as recorded
    print(out["status"], out["refund"])


if __name__ == "__main__":
    dsn = os.environ.get("MANDATED_DATABASE_URL")
    if dsn:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            main(saver)
    else:
        from langgraph.checkpoint.memory import InMemorySaver

        main(InMemorySaver())
