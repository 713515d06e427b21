package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mandated/mandated/wire"
)

// ErrNotRecordable: a read could not be recorded (no such mandate, or the
// command was refused): Read returns it with the decision and no result.
var ErrNotRecordable = errors.New("client: the read could not be recorded")

// ReadFunc performs a read-only call (a search, a price lookup) and
// returns its answer, a JSON object of at most 8 KiB.
type ReadFunc func(ctx context.Context) (json.RawMessage, error)

// Reading is what Read observed.
type Reading struct {
	// Result is the intent's recorded result: the first one recorded, the
	// same for every caller and every repeat.
	Result json.RawMessage
	// Decision is the decision that answered with it (recorded, or
	// replayed with original outcome recorded).
	Decision *Decision
	// Fetched is true when this call ran fn (a concurrent first caller
	// may have recorded its own answer first: then Result is that one).
	Fetched bool
	// Recorded is true when this call's answer is the recorded one.
	Recorded bool
}

// RecordRead sends a record (or, without Result, a look-up) and returns
// its decision.
func (c *Client) RecordRead(ctx context.Context, r RecordRead) (*Decision, error) {
	return c.Send(ctx, r)
}

// Read returns the recorded answer of a read (seed 003: a retrieval's
// result is kept with the task record and reused on replay): it looks the
// intent's record up first, and only when nothing is recorded runs fn and
// records its answer. A restored or resumed agent therefore never reads
// again: it gets the first answer. Concurrent first callers may each run
// fn; all get the one recorded answer. r.Result is ignored.
//
// A recorded answer to another target (the intent's record names another
// one) is refused with a *ReplayDiffersError (errors.Is ErrReplayDiffers),
// fn not run, unless the caller accepts it with AcceptDiffers("target").
// An error of fn is returned as it is, and nothing is recorded. A read
// takes no authority: it is recorded on an exhausted or revoked mandate;
// without a mandate it is ErrNotRecordable.
func (c *Client) Read(ctx context.Context, r RecordRead, fn ReadFunc, opts ...CallOption) (*Reading, error) {
	o := optionsOf(opts)
	r.Result = nil
	d, err := c.RecordRead(ctx, r)
	if err != nil {
		return nil, err
	}
	if d.Outcome == wire.OutcomeRefused && d.Reason == wire.ReasonNotRecorded {
		res, err := fn(ctx)
		if err != nil {
			return &Reading{Decision: d, Fetched: true}, err
		}
		if res == nil {
			res = json.RawMessage("null") // refused by the decoder: a result is an object
		}
		r.Result = res
		if d, err = c.RecordRead(ctx, r); err != nil {
			return &Reading{Fetched: true}, err
		}
		rd, err := recorded(d, o)
		if rd != nil {
			rd.Fetched, rd.Recorded = true, d.Outcome == wire.OutcomeRecorded
		}
		return rd, err
	}
	return recorded(d, o)
}

// recorded turns the answer to a record into Read's.
func recorded(d *Decision, o callOptions) (*Reading, error) {
	switch {
	case d.Outcome == wire.OutcomeRecorded,
		d.Outcome == wire.OutcomeReplayed && d.OriginalOutcome == wire.OutcomeRecorded:
		if differs := unaccepted(d.Differs, o.acceptDiffers); len(differs) > 0 {
			return nil, &ReplayDiffersError{Org: d.Org, MandateID: d.MandateID, AuthorizationID: d.AuthorizationID, Fields: differs}
		}
		return &Reading{Result: d.Result(), Decision: d}, nil
	default:
		return &Reading{Decision: d}, fmt.Errorf("%w: %s %s: %s", ErrNotRecordable, d.Outcome, d.Reason, d.Detail)
	}
}
