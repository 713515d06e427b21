package processor

import (
	"errors"
	"time"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink"
)

// refusedDeadlineRetry is how long a deadline move the database refused
// waits before it is tried again.
const refusedDeadlineRetry = time.Minute

// isolateDeadlines commits deadline moves the database refused as a batch,
// halving the batch until the move responsible is alone: every other
// reservation expires (and stops counting as held) now. The move refused
// alone is scheduled again after refusedDeadlineRetry rather than forgotten
// until the partition's next claim.
func (w *worker) isolateDeadlines(due []lifecycle.AuthKey, now time.Time) error {
	err := w.commit(nil, due, now)
	if !errors.Is(err, sink.ErrRecordFault) {
		return err
	}
	if len(due) == 1 {
		w.p.metrics.RecordFaults.Inc()
		w.deadlines.set(due[0], now.Add(refusedDeadlineRetry))
		w.pending.Store(int64(w.deadlines.len()))
		w.log.Error().Err(err).Str("mandate", due[0].Mandate.String()).Str("authorization_id", due[0].ID).
			Dur("retry_in", refusedDeadlineRetry).Msg("the database refuses this deadline move; trying again later")
		return nil
	}
	mid := len(due) / 2
	if err := w.isolateDeadlines(due[:mid], now); err != nil {
		return err
	}
	return w.isolateDeadlines(due[mid:], now)
}
