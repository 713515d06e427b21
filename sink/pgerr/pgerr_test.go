package pgerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/sink/pgerr"
)

// TestEachSQLStateBecomesOneWordOfTheVocabulary pins the translation sink
// and admin share: what each SQLSTATE (and a missing row, an injected
// fault, a cancelled context) means to a caller.
func TestEachSQLStateBecomesOneWordOfTheVocabulary(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code, Message: "msg " + code, Hint: "shard-b"})
	}
	for _, c := range []struct {
		name  string
		err   error
		is    error
		cause string
	}{
		{"a serialization failure is retried", pg("40001"), pgerr.ErrRetryable, "serialization"},
		{"a deadlock is retried", pg("40P01"), pgerr.ErrRetryable, "deadlock"},
		{"a lock timeout is retried", pg(pgerr.LockNotAvailable), pgerr.ErrRetryable, "lock_timeout"},
		{"a unique violation is a concurrent writer, retried", pg(pgerr.UniqueViolation), pgerr.ErrRetryable, "unique"},
		{"a statement timeout is retried", pg("57014"), pgerr.ErrRetryable, "statement_timeout"},
		{"a row count other than meant is a moved version, retried", pg(pgerr.Rows), pgerr.ErrRetryable, "version"},
		{"a check violation is the record's fault", pg("23514"), pgerr.ErrRecordFault, ""},
		{"a data error is the record's fault", pg("22003"), pgerr.ErrRecordFault, ""},
		{"a trigger's exception is the record's fault", pg("P0001"), pgerr.ErrRecordFault, ""},
		{"a refused privilege is the record's fault", pg(pgerr.InsufficientPrivilege), pgerr.ErrRecordFault, ""},
		{"a moved partition is moved and fenced", pg(pgerr.Moved), pgerr.ErrFenced, ""},
		{"no row is not found", pgx.ErrNoRows, pgerr.ErrNotFound, ""},
		{"an injected fault is retried", failpoint.ErrInjected, pgerr.ErrRetryable, "injected"},
		{"a cancelled context stays itself", context.Canceled, context.Canceled, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := pgerr.Interpret(c.err)
			require.ErrorIs(t, got, c.is)
			require.Equal(t, c.cause, pgerr.RetryCause(got))
			require.Same(t, got, pgerr.Interpret(got), "a translated error passes through unchanged")
		})
	}
	moved := pgerr.Interpret(pg(pgerr.Moved))
	require.ErrorIs(t, moved, pgerr.ErrMoved)
	to, ok := pgerr.MovedTo(moved)
	require.True(t, ok)
	require.Equal(t, "shard-b", to, "the shard a partition moved to is the error's hint")

	other := pgerr.Interpret(pg("XX000"))
	require.EqualError(t, other, "sink: postgres error XX000: msg XX000")
	require.False(t, errors.Is(other, pgerr.ErrRetryable) || errors.Is(other, pgerr.ErrRecordFault))
	require.NoError(t, pgerr.Interpret(nil))
}

// TestIsAndUnansweredReadTheSQLStateOnly: Is matches a wrapped error's
// SQLSTATE; an error without one is a database that did not answer.
func TestIsAndUnansweredReadTheSQLStateOnly(t *testing.T) {
	t.Parallel()
	undefined := fmt.Errorf("heartbeat: %w", &pgconn.PgError{Code: pgerr.UndefinedTable, Message: "no table"})
	require.True(t, pgerr.Is(undefined, pgerr.UndefinedTable))
	require.False(t, pgerr.Is(undefined, pgerr.LockNotAvailable))
	require.False(t, pgerr.Is(errors.New("dial tcp: refused"), pgerr.UndefinedTable))
	pe, ok := pgerr.As(undefined)
	require.True(t, ok)
	require.Equal(t, "no table", pe.Message)

	require.False(t, pgerr.Unanswered(undefined), "PostgreSQL answered")
	require.True(t, pgerr.Unanswered(errors.New("dial tcp: refused")))
	require.False(t, pgerr.Unanswered(nil))
}
