package processor

import (
	"context"
	"errors"
	"time"

	"github.com/mandated/mandated/sink"
)

// A partition moved to another shard (mandatectl shards move) is refused
// where it was: its epoch there was bumped, so this worker's next commit
// fails its fence, and every claim of it there fails with sink.ErrMoved.
// The processor then reloads its shard map file and claims the partition
// where the map now says it lives; until the move has written the new map,
// the reload changes nothing and the claim is tried again shortly (the
// database, not the map, decides: a map older than a move is refused by
// the source and a map newer than it by the target). Nothing is decided
// twice: the target holds the partition's rows as of the source's last
// commit, offsets and idempotency keys included, and the worker drops
// every record below the stored position.

// movedRetry is how soon a claim refused because the partition moved is
// first tried again (with the shard map reloaded); it doubles up to
// movedRetryMax while the map does not say where the partition went.
const (
	movedRetry    = 200 * time.Millisecond
	movedRetryMax = 2 * time.Second
)

// followMove reloads the shard map after a claim of partition n was
// refused with sink.ErrMoved.
func (p *Processor) followMove(ctx context.Context, n int32, err error) {
	to, _ := sink.MovedTo(err)
	if rerr := p.shards.Reload(ctx); rerr != nil {
		p.log.Error().Err(rerr).Int32("partition", n).Str("moved_to", to).
			Msg("partition moved to another shard but the shard map cannot be reloaded; retrying")
		return
	}
	now := p.shards.For(n).Shard().Name
	if now != to {
		p.log.Info().Int32("partition", n).Str("moved_to", to).Str("map_says", now).
			Msg("partition moved to another shard; the shard map does not say so yet (the move is still writing it)")
		return
	}
	p.log.Info().Int32("partition", n).Str("moved_to", to).Msg("partition moved to another shard: shard map reloaded, claiming it there")
}

// isMoved reports whether err is a claim refused because the partition moved.
func isMoved(err error) bool { return errors.Is(err, sink.ErrMoved) }
