package sink

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
)

// rowsCode is the SQLSTATE mandated_expect_rows raises when a batch's write
// touched another number of rows than it meant to (migration 0036).
const rowsCode = "MD002"

// retryable is an ErrRetryable with a short cause for metrics.
type retryable struct {
	cause string
	msg   string
}

func (r *retryable) Error() string        { return "sink: retryable conflict (" + r.cause + "): " + r.msg }
func (r *retryable) Is(target error) bool { return target == ErrRetryable }

func retry(cause, format string, args ...any) error {
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

// interpretError translates a driver error into the sink's vocabulary. It
// is the only place that looks at SQLSTATEs.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFenced) || errors.Is(err, ErrRetryable) || errors.Is(err, ErrRecordFault) || errors.Is(err, ErrNotFound) {
		return err
	}
	if errors.Is(err, failpoint.ErrInjected) {
		return retry("injected", "%v", err)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == movedCode:
			return interpretMoved(pgErr)
		case pgErr.Code == rowsCode:
			return retry("version", "%s", pgErr.Message)
		case pgErr.Code == "40001":
			return retry("serialization", "%s", pgErr.Message)
		case pgErr.Code == "40P01":
			return retry("deadlock", "%s", pgErr.Message)
		case pgErr.Code == "55P03":
			return retry("lock_timeout", "%s", pgErr.Message)
		case pgErr.Code == "23505": // a concurrent writer got there first
			return retry("unique", "%s", pgErr.Message)
		case pgErr.Code == "57014":
			return retry("statement_timeout", "%s", pgErr.Message)
		case pgErr.Code[:2] == "22", pgErr.Code[:2] == "23", pgErr.Code == "P0001", pgErr.Code == "42501":
			return fmt.Errorf("%w: %s (%s)", ErrRecordFault, pgErr.Message, pgErr.Code)
		}
		return fmt.Errorf("sink: postgres error %s: %s", pgErr.Code, pgErr.Message)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("sink: %w", err)
}
