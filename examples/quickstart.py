import os
import mandated

gw = mandated.Client(os.environ["MANDATED_GATEWAY_URL"], os.environ["MANDATED_GATEWAY_TOKEN"], "acme")
run_id = "run-7f3a"  # the orchestrator's run: the same facts give the same key, the curl's above
d = gw.propose("refund-case-1842",
               idempotency_key=mandated.intent_key(run_id, "3", "payment.refund"),  # equal to Go's
               operation="payment.refund", target="customer-77", amount=15000, currency="EUR")
print(d.outcome)  # "reserved", or "replayed" after the curl: one intent, one authorization


def refund(provider_key):  # your provider's call; provider_key is its idempotency key
    return mandated.Effect(external_ref="re_" + provider_key[-12:], result={"status": "succeeded"})


ex = gw.execute(d, refund)  # runs refund once however many workers resume this approval
print(ex.external_ref, ex.result)  # the winner's, for every caller; mandated.InDoubt: never run it yourself
