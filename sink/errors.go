package sink

import (
	"github.com/mandated/mandated/sink/pgerr"
)

// The sink's error vocabulary. The translation from PostgreSQL's errors is
// package pgerr's, shared with the admin package; these are the same
// values, so errors.Is matches either name.
var (
	// ErrFenced: the partition's epoch moved on; this owner is stale and
	// must stop. Nothing it tried to write was written.
	ErrFenced = pgerr.ErrFenced
	// ErrRetryable: a serialization failure, deadlock, lock timeout or a
	// concurrent write (another partition took an idempotency key, a
	// version moved); the whole batch can be decided again.
	ErrRetryable = pgerr.ErrRetryable
	// ErrRecordFault: the database refused the batch's content (a check,
	// a trigger, a data error). Retrying the same content fails again; the
	// processor isolates the record responsible.
	ErrRecordFault = pgerr.ErrRecordFault
	// ErrNotFound: no such row.
	ErrNotFound = pgerr.ErrNotFound
	// ErrMoved says a partition was moved to another shard: this database
	// refuses its claims, commits and relay marks. It is also an ErrFenced
	// (the epoch moved on); a processor that meets it reloads its shard map
	// and claims the partition where it lives now.
	ErrMoved = pgerr.ErrMoved
)

// MovedTo returns the shard a partition moved to, from an ErrMoved.
func MovedTo(err error) (string, bool) { return pgerr.MovedTo(err) }

// interpretError translates a driver error into the sink's vocabulary
// (pgerr.Interpret).
func interpretError(err error) error { return pgerr.Interpret(err) }
