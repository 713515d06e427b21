-- A decision history the console can search (issue 43). The outbox holds a
-- decision only until the relay has published it and housekeeping deleted
-- it (in chunks of 256, or at once when idle): PostgreSQL kept no record
-- of a denial, a conflict, a grant's earlier version, a losing begin or a
-- repeat, only each authorization's current row. The decisions topic is
-- the full, chained record (verify reads it); this is the operators'
-- index into it, kept for a retention.
--
-- Rows arrive when housekeeping deletes published outbox rows: a statement
-- trigger copies each deleted decision (kind 0; never a dead letter) here,
-- in the transaction that deletes it, so a decision is in the outbox or in
-- the history, never in neither. Nothing is added to the decision's own
-- transaction (the processor's commit): the copy is the relay's, off the
-- path a decision waits on. A decision the trigger cannot read (not UTF-8,
-- not JSON) is kept with what the outbox row says (command 'unknown'); the
-- trigger never fails the delete.
--
-- decision_history_settings (one row per database): retention is how long
-- a decision is kept (0: no history, nothing copied, nothing counted),
-- 7 days by default, Kafka's default retention of a topic: the history is
-- an index into the decisions topic, so keep it as long as the topic keeps
-- its records;
-- kept_since is when history started (this migration, or the retention
-- turned on again): decisions housekept before it are not here. Rows older
-- than the retention are deleted by the same trigger, oldest first, a
-- bounded number each time (twice the rows it copies, plus 500), skipping
-- rows another transaction holds.
--
-- decision_counts: decisions per minute by partition, outcome and reason,
-- appended by the trigger (never updated: two housekeeping transactions
-- never wait on one row), for the console's overview; kept as long.
CREATE TABLE decision_history_settings (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    retention  interval    NOT NULL DEFAULT interval '7 days' CHECK (retention >= interval '0'),
    kept_since timestamptz NOT NULL DEFAULT now()
);
INSERT INTO decision_history_settings DEFAULT VALUES;

-- Turning history on again starts it again: what was housekept while it
-- was off is not here, and kept_since says so.
CREATE FUNCTION mandated_history_restart() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.retention = interval '0' AND NEW.retention > interval '0' THEN
        NEW.kept_since := now();
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER decision_history_settings_restart BEFORE UPDATE ON decision_history_settings
    FOR EACH ROW EXECUTE FUNCTION mandated_history_restart();

CREATE TABLE decision_history (
    partition        integer     NOT NULL,
    seq              bigint      NOT NULL,
    decided_at       timestamptz NOT NULL, -- the outbox row's created_at: the batch's clock, as the decision's decided_at
    org              text        NOT NULL,
    mandate_id       text        NOT NULL,
    command          text        NOT NULL,
    outcome          text        NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    authorization_id text        NOT NULL DEFAULT '',
    idempotency_key  text        NOT NULL DEFAULT '',
    intent_run_id    text        NOT NULL DEFAULT '', -- the intent a reservation (or a fork) bound
    executor         text        NOT NULL DEFAULT '', -- on the begin that won
    external_ref     text        NOT NULL DEFAULT '', -- on the decision that committed
    source_topic     text        NOT NULL DEFAULT '',
    source_partition integer     NOT NULL DEFAULT -1,
    source_offset    bigint      NOT NULL DEFAULT -1,
    payload          bytea       NOT NULL,            -- the decision as the relay published it
    PRIMARY KEY (partition, seq)
) WITH (toast_tuple_target = 512); -- payloads of ~1 KiB are compressed
-- A mandate's history, newest first (keyset on decided_at, partition, seq).
CREATE INDEX decision_history_mandate ON decision_history (org, mandate_id, decided_at, partition, seq);
-- The purge, oldest first.
CREATE INDEX decision_history_decided ON decision_history (decided_at);
-- The console's search keys, each on the rows that carry it.
CREATE INDEX decision_history_authorization ON decision_history (authorization_id) WHERE authorization_id <> '';
CREATE INDEX decision_history_key ON decision_history (idempotency_key) WHERE idempotency_key <> '';
CREATE INDEX decision_history_intent ON decision_history (intent_run_id) WHERE intent_run_id <> '';
CREATE INDEX decision_history_executor ON decision_history (executor) WHERE executor <> '';
CREATE INDEX decision_history_ref ON decision_history (external_ref) WHERE external_ref <> '';
CREATE INDEX decision_history_source ON decision_history (source_partition, source_offset) WHERE source_offset >= 0;

CREATE TABLE decision_counts (
    minute    timestamptz NOT NULL,
    partition integer     NOT NULL,
    outcome   text        NOT NULL,
    reason    text        NOT NULL,
    n         bigint      NOT NULL CHECK (n > 0)
);
CREATE INDEX decision_counts_minute ON decision_counts (minute);

-- mandated_history_json reads a payload as JSON whose members the history
-- casts (the source's partition and offset), or NULL: only the row-by-row
-- fallback calls it.
CREATE FUNCTION mandated_history_json(payload bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    x jsonb;
BEGIN
    x := convert_from(payload, 'UTF8')::jsonb;
    PERFORM (x#>>'{source,partition}')::integer, (x#>>'{source,offset}')::bigint;
    RETURN x;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

CREATE FUNCTION mandated_keep_history() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    keep   interval;
    copied bigint := 0;
BEGIN
    -- A partition's rows dropped after it moved to another shard
    -- (mandatectl shards drop-moved): its history went with it.
    IF coalesce(current_setting('mandated.drop_moved', true), '') <> '' THEN
        RETURN NULL;
    END IF;
    SELECT retention INTO keep FROM decision_history_settings;
    IF keep IS NULL OR keep <= interval '0' THEN
        RETURN NULL;
    END IF;
    BEGIN
        -- Every payload a decision: one statement, no subtransaction per row.
        WITH rows AS (
            INSERT INTO decision_history (partition, seq, decided_at, org, mandate_id, command, outcome, reason, authorization_id,
                idempotency_key, intent_run_id, executor, external_ref, source_topic, source_partition, source_offset, payload)
            SELECT g.partition, g.seq, g.created_at,
                coalesce(x->>'org', ''), coalesce(x->>'mandate_id', ''), coalesce(x->>'command', ''), coalesce(x->>'outcome', ''),
                coalesce(x->>'reason', ''), coalesce(x->>'authorization_id', ''), coalesce(x->>'idempotency_key', ''),
                coalesce(x#>>'{binds,intent,run_id}', ''),
                CASE WHEN x->>'command' = 'begin' AND x->>'outcome' = 'executing' THEN coalesce(x#>>'{authorization,executor}', '') ELSE '' END,
                CASE WHEN x->>'outcome' = 'committed' THEN coalesce(x#>>'{authorization,external_ref}', '') ELSE '' END,
                coalesce(x#>>'{source,topic}', ''), coalesce((x#>>'{source,partition}')::integer, -1),
                coalesce((x#>>'{source,offset}')::bigint, -1), g.payload
            FROM gone g CROSS JOIN LATERAL (SELECT convert_from(g.payload, 'UTF8')::jsonb AS x OFFSET 0) p -- parsed once
            WHERE g.kind = 0
            ON CONFLICT DO NOTHING
            RETURNING partition, decided_at, outcome, reason
        ), counted AS (
            INSERT INTO decision_counts (minute, partition, outcome, reason, n)
            SELECT date_trunc('minute', decided_at), partition, outcome, reason, count(*) FROM rows GROUP BY 1, 2, 3, 4
            RETURNING n
        )
        SELECT coalesce(sum(n), 0) INTO copied FROM counted;
    EXCEPTION WHEN others THEN
        BEGIN
            -- A payload could not be read: each row kept as far as it can
            -- be read (an unreadable one with the mandate of its record key).
            WITH rows AS (
                INSERT INTO decision_history (partition, seq, decided_at, org, mandate_id, command, outcome, reason, authorization_id,
                    idempotency_key, intent_run_id, executor, external_ref, source_topic, source_partition, source_offset, payload)
                SELECT g.partition, g.seq, g.created_at,
                    coalesce(x->>'org', split_part(k, '/', 1)), coalesce(x->>'mandate_id', substr(k, length(split_part(k, '/', 1)) + 2)),
                    CASE WHEN x IS NULL THEN 'unknown' ELSE coalesce(x->>'command', '') END, coalesce(x->>'outcome', ''),
                    coalesce(x->>'reason', ''), coalesce(x->>'authorization_id', ''), coalesce(x->>'idempotency_key', ''),
                    coalesce(x#>>'{binds,intent,run_id}', ''),
                    CASE WHEN x->>'command' = 'begin' AND x->>'outcome' = 'executing' THEN coalesce(x#>>'{authorization,executor}', '') ELSE '' END,
                    CASE WHEN x->>'outcome' = 'committed' THEN coalesce(x#>>'{authorization,external_ref}', '') ELSE '' END,
                    coalesce(x#>>'{source,topic}', g.source_topic), coalesce((x#>>'{source,partition}')::integer, g.source_partition),
                    coalesce((x#>>'{source,offset}')::bigint, g.source_offset), g.payload
                FROM gone g
                CROSS JOIN LATERAL (SELECT mandated_history_json(g.payload) AS x,
                    encode(coalesce(g.record_key, ''::bytea), 'escape') AS k OFFSET 0) p
                WHERE g.kind = 0
                ON CONFLICT DO NOTHING
                RETURNING partition, decided_at, outcome, reason
            ), counted AS (
                INSERT INTO decision_counts (minute, partition, outcome, reason, n)
                SELECT date_trunc('minute', decided_at), partition, outcome, reason, count(*) FROM rows GROUP BY 1, 2, 3, 4
                RETURNING n
            )
            SELECT coalesce(sum(n), 0) INTO copied FROM counted;
        EXCEPTION WHEN others THEN
            -- Never fail the relay's housekeeping for the history.
            RAISE WARNING 'mandated: decisions deleted from the outbox were not kept in decision_history: %', SQLERRM;
            RETURN NULL;
        END;
    END;
    DELETE FROM decision_history WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM decision_history WHERE decided_at < now() - keep
        ORDER BY decided_at LIMIT 2 * copied + 500 FOR UPDATE SKIP LOCKED));
    DELETE FROM decision_counts WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM decision_counts WHERE minute < now() - keep
        ORDER BY minute LIMIT 500 FOR UPDATE SKIP LOCKED));
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_keep_history AFTER DELETE ON outbox
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION mandated_keep_history();
