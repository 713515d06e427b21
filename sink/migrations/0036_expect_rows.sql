-- A batch sends its writes and its COMMIT in one round trip (issue 26), so
-- the checks that each write touched exactly the rows it meant to — a
-- version compare-and-set that found its row moved, an idempotency key or
-- an intent another partition took since the batch loaded, the position's
-- compare-and-set — run in the database, before the COMMIT: each write
-- counts the rows it returned and calls this, a count other than the
-- batch's raises, the transaction aborts, and the COMMIT behind it never
-- runs. MD002 tells the sink to decide the batch again.
CREATE FUNCTION mandated_expect_rows(got bigint, want bigint, what text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION 'mandated: % wrote % of % rows (a concurrent write moved a version or took a key)', what, got, want
            USING ERRCODE = 'MD002';
    END IF;
END $$;
