// Package backoff is the one capped exponential backoff of mandated: every
// retry loop (a start-up that waits for Kafka, a worker that cannot read its
// deadlines, a batch whose transaction conflicted, a shard that does not
// answer) asks it how long to wait next instead of doubling a duration of
// its own.
//
// A Backoff is not safe for concurrent use; each loop owns one.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields Min, 2×Min, 4×Min, … up to Max, then Max again, until
// Reset. With Jitter each wait is drawn from [d/2, 3d/2) around the step d,
// so that loops that failed together do not retry together.
type Backoff struct {
	Min, Max time.Duration
	Jitter   bool
	step     time.Duration
}

// New returns a backoff from min to max without jitter.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max} }

// Jittered returns a backoff from min to max with jitter.
func Jittered(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max, Jitter: true} }

// Next returns the wait before the next attempt and doubles the step (up to
// Max).
func (b *Backoff) Next() time.Duration {
	d := b.Current()
	b.step = min(2*d, max(b.Max, b.Min))
	if b.Jitter && d > 0 {
		return d/2 + rand.N(d)
	}
	return d
}

// Current is the step Next returns next (without jitter).
func (b *Backoff) Current() time.Duration {
	if b.step <= 0 {
		return b.Min
	}
	return b.step
}

// Reset starts over from Min: the thing retried succeeded.
func (b *Backoff) Reset() { b.step = 0 }

// Wait sleeps for Next() or until ctx ends; false when ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep waits for d or until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
