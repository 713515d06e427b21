package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/lifecycle"
)

// RefreshReplay reloads the per-org possible-replay settings.
func (s *Sink) RefreshReplay(ctx context.Context) error {
	s = s.settings()
	rows, err := s.pool.Query(ctx, `SELECT org, extract(epoch FROM replay_window)::float8, replay_policy
		FROM org_settings WHERE replay_window IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	m := map[string]lifecycle.ReplaySetting{}
	var org, policy string
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&org, &secs, &policy}, func() error {
		m[org] = lifecycle.ReplaySetting{Window: time.Duration(secs * float64(time.Second)), Policy: lifecycle.ReplayPolicy(policy)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	s.replay.Store(&m)
	return nil
}

// ReplaySetting returns an org's possible-replay setting (a zero Window:
// the check is off), as of the last refresh.
func (s *Sink) ReplaySetting(org string) lifecycle.ReplaySetting {
	s = s.settings()
	if m := s.replay.Load(); m != nil {
		return (*m)[org]
	}
	return lifecycle.ReplaySetting{}
}

// PurgeExpiredIntents deletes at most limit intents bound on a partition
// whose retention ended before now and whose latest authorization is
// terminal: an intent is never forgotten while its authorization can still
// act, however old it is (a restored agent must still be answered by it).
func (s *Sink) PurgeExpiredIntents(ctx context.Context, partition int32, now time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM intents WHERE ctid = ANY (ARRAY(
			SELECT i.ctid FROM intents i WHERE i.partition = $1 AND i.expires_at < $2
			AND NOT EXISTS (SELECT 1 FROM authorizations a WHERE a.org = i.org AND a.mandate_id = i.head_mandate_id
				AND a.authorization_id = i.head_authorization_id
				AND a.state NOT IN ('committed', 'cancelled', 'expired', 'revoked', 'recorded'))
			LIMIT $3))`, partition, now, limit)
	if err != nil {
		return 0, fmt.Errorf("sink: purge expired intents of partition %d: %w", partition, interpretError(err))
	}
	return tag.RowsAffected(), nil
}
