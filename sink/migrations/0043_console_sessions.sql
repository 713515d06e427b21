-- The console's sign-in sessions (issue 32): a session is the server's,
-- not the operator token copied into a cookie. The cookie holds a random
-- session secret; only its SHA-256 is stored, with the operator token it
-- was opened with, its expiry and when sign-out ended it. A session acts
-- only while it has not expired, was not ended and its operator token is
-- not revoked (revoking the token ends all its sessions at once). The
-- gateway's role may insert and end sessions (deploy/postgres/gateway-role.sql):
-- the only rows it writes. Expired rows are purged by the console itself,
-- a bounded number at each sign-in. On the control shard, as the tokens.
CREATE TABLE console_sessions (
    session_hash bytea       PRIMARY KEY CHECK (length(session_hash) = 32),
    token_id     text        NOT NULL REFERENCES operator_tokens (token_id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL CHECK (expires_at > created_at),
    ended_at     timestamptz
);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
CREATE TRIGGER console_sessions_guard_control BEFORE INSERT OR UPDATE ON console_sessions
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
