-- The W3C trace context of the record an outbox row answers (issue 28):
-- the processor's decode span (tracing on) or the record's own traceparent
-- header (tracing off, a producer that traces). The relay publishes it as
-- the decision's traceparent header, so a decision carries the trace of the
-- command it answers. NULL for a record without one: a batch with no traced
-- record does not name the column (sink insertOutboxSQL). The decision
-- chain does not cover it (the chain hashes the published value; headers
-- are not part of it). A nullable column without a default: no table
-- rewrite. Parked rows (outbox_parked) do not keep it.
ALTER TABLE outbox ADD COLUMN trace_parent text CHECK (length(trace_parent) BETWEEN 55 AND 256);
