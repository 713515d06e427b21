// Package pgerr is the one translation of PostgreSQL's errors into
// mandated's storage vocabulary, shared by the runtime sink and the admin
// package: a SQLSTATE is looked at here and nowhere else (river's
// interpretError). Callers see ErrFenced, ErrRetryable, ErrRecordFault,
// ErrNotFound, ErrMoved or a wrapped connection error, and ask Is for the
// few SQLSTATEs a caller branches on (a table not there yet, a lock not
// available).
//
// It stands on the driver and internal/failpoint alone; it must never
// import sink, admin or anything that decides.
package pgerr

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandated/mandated/internal/failpoint"
)

var (
	// ErrFenced: the partition's epoch moved on; this owner is stale and
	// must stop. Nothing it tried to write was written.
	ErrFenced = errors.New("sink: partition epoch is stale (fenced)")
	// ErrRetryable: a serialization failure, deadlock, lock timeout or a
	// concurrent write (another partition took an idempotency key, a
	// version moved); the whole batch can be decided again.
	ErrRetryable = errors.New("sink: retryable conflict")
	// ErrRecordFault: the database refused the batch's content (a check,
	// a trigger, a data error). Retrying the same content fails again; the
	// processor isolates the record responsible.
	ErrRecordFault = errors.New("sink: the database refused the batch content")
	// ErrNotFound: no such row.
	ErrNotFound = errors.New("sink: not found")
	// ErrMoved says a partition was moved to another shard: this database
	// refuses its claims, commits and relay marks. It is also an ErrFenced
	// (the epoch moved on); a processor that meets it reloads its shard map
	// and claims the partition where it lives now.
	ErrMoved = errors.New("sink: the partition moved to another shard")
)

// SQLSTATEs mandated's code branches on.
const (
	// Moved is the SQLSTATE mandated_owns raises for a moved partition
	// (migration 0014); its HINT is the shard the partition moved to.
	Moved = "MD001"
	// Rows is the SQLSTATE mandated_expect_rows raises when a batch's
	// write touched another number of rows than it meant to (migration
	// 0036).
	Rows = "MD002"
	// UndefinedTable: a table a newer migration creates is not there yet.
	UndefinedTable = "42P01"
	// LockNotAvailable: a NOWAIT lock or lock_timeout gave up.
	LockNotAvailable = "55P03"
	// UniqueViolation: a row with that key exists.
	UniqueViolation = "23505"
	// InsufficientPrivilege: the role may not do that.
	InsufficientPrivilege = "42501"
)

// Is reports whether err is a PostgreSQL error with SQLSTATE code.
func Is(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// As returns err's PostgreSQL error, if it is one: for its message or
// hint once Is or the Code has said what it is.
func As(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	ok := errors.As(err, &pgErr)
	return pgErr, ok
}

// Unanswered reports whether err says the database did not answer (no
// connection, a deadline), rather than answered with an error.
func Unanswered(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr)
}

// retryable is an ErrRetryable with a short cause for metrics.
type retryable struct {
	cause string
	msg   string
}

func (r *retryable) Error() string        { return "sink: retryable conflict (" + r.cause + "): " + r.msg }
func (r *retryable) Is(target error) bool { return target == ErrRetryable }

// Retry is an ErrRetryable with a short cause (RetryCause) and a message.
func Retry(cause, format string, args ...any) error {
	return &retryable{cause: cause, msg: fmt.Sprintf(format, args...)}
}

// RetryCause returns the short cause of a retryable error ("serialization",
// "deadlock", "lock_timeout", "unique", "version", "statement_timeout",
// "commit_unknown"), or "" for other errors.
func RetryCause(err error) string {
	var r *retryable
	if errors.As(err, &r) {
		return r.cause
	}
	return ""
}

// movedError is an ErrMoved naming the shard the partition moved to.
type movedError struct {
	To  string
	msg string
}

func (e *movedError) Error() string { return "sink: " + e.msg }

func (e *movedError) Is(target error) bool { return target == ErrMoved || target == ErrFenced }

// MovedTo returns the shard a partition moved to, from an ErrMoved.
func MovedTo(err error) (string, bool) {
	var m *movedError
	if errors.As(err, &m) {
		return m.To, true
	}
	return "", false
}

func interpretMoved(pgErr *pgconn.PgError) error {
	return &movedError{To: pgErr.Hint, msg: pgErr.Message}
}

// Interpret translates a driver error into the storage vocabulary. It is
// the only place that looks at SQLSTATEs to decide what an error means.
func Interpret(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrRetryable) || errors.Is(err, ErrRecordFault) || errors.Is(err, ErrNotFound) {
		return err
	}
	if errors.Is(err, failpoint.ErrInjected) {
		return Retry("injected", "%v", err)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == Moved:
			return interpretMoved(pgErr)
		case pgErr.Code == Rows:
			return Retry("version", "%s", pgErr.Message)
		case pgErr.Code == "40001":
			return Retry("serialization", "%s", pgErr.Message)
		case pgErr.Code == "40P01":
			return Retry("deadlock", "%s", pgErr.Message)
		case pgErr.Code == LockNotAvailable:
			return Retry("lock_timeout", "%s", pgErr.Message)
		case pgErr.Code == UniqueViolation: // a concurrent writer got there first
			return Retry("unique", "%s", pgErr.Message)
		case pgErr.Code == "57014":
			return Retry("statement_timeout", "%s", pgErr.Message)
		case pgErr.Code[:2] == "22", pgErr.Code[:2] == "23", pgErr.Code == "P0001", pgErr.Code == InsufficientPrivilege:
			return fmt.Errorf("%w: %s (%s)", ErrRecordFault, pgErr.Message, pgErr.Code)
		}
		return fmt.Errorf("sink: postgres error %s: %s", pgErr.Code, pgErr.Message)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("sink: %w", err)
}
