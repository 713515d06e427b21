package sink

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/sink/pgerr"
	"github.com/mandated/mandated/wire"
)

// Decision keys: the public halves of the keys that sign every record
// mandated publishes (wire/decisionsig.go), in decision_keys on the
// control shard (migration 0048). mandated registers its own at start
// (RegisterDecisionKey); operators add, list and revoke them (mandatectl
// decision-keys, admin); the relay's tail reads, verify, recover and the
// gateway read them (LoadDecisionKeys, DecisionKeyCache).

// DecisionKeyRow is one registered decision key.
type DecisionKeyRow struct {
	wire.DecisionKey
	Alg       string
	Note      string
	CreatedAt time.Time
}

const decisionKeyColumns = `key_id, alg, public_key, valid_from, valid_until, revoked_at, note, created_at`

func scanDecisionKey(row pgx.Row) (DecisionKeyRow, error) {
	var k DecisionKeyRow
	var pub []byte
	var until, revoked *time.Time
	if err := row.Scan(&k.KeyID, &k.Alg, &pub, &k.ValidFrom, &until, &revoked, &k.Note, &k.CreatedAt); err != nil {
		return k, err
	}
	k.PublicKey = ed25519.PublicKey(pub)
	if until != nil {
		k.ValidUntil = *until
	}
	if revoked != nil {
		k.RevokedAt = *revoked
	}
	return k, nil
}

// DecisionKeyRows lists every registered decision key, oldest first.
func DecisionKeyRows(ctx context.Context, q KeyQuerier) ([]DecisionKeyRow, error) {
	rows, err := q.Query(ctx, `SELECT `+decisionKeyColumns+` FROM decision_keys ORDER BY valid_from, key_id`)
	if err != nil {
		return nil, fmt.Errorf("sink: read decision keys: %w", interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DecisionKeyRow, error) { return scanDecisionKey(r) })
	if err != nil {
		return nil, fmt.Errorf("sink: read decision keys: %w", interpretError(err))
	}
	return out, nil
}

// LoadDecisionKeys reads every registered decision key.
func LoadDecisionKeys(ctx context.Context, q KeyQuerier) (wire.DecisionKeys, error) {
	rows, err := DecisionKeyRows(ctx, q)
	if err != nil {
		return nil, err
	}
	ks := make(wire.DecisionKeys, len(rows))
	for _, r := range rows {
		ks[r.KeyID] = r.DecisionKey
	}
	return ks, nil
}

// ErrDecisionKeyUnusable says the key mandated was given is registered but
// revoked or outside its validity window now: it must not sign.
var ErrDecisionKeyUnusable = errors.New("sink: the decision signing key cannot sign now")

// RegisterDecisionKey makes sure the signer's key is registered: a key the
// database does not know is added, valid from validFrom (the note says
// who added it); one it knows must be valid at now. It returns the key as
// registered, and whether this call added it.
func RegisterDecisionKey(ctx context.Context, q KeyQuerier, pub ed25519.PublicKey, validFrom, now time.Time, note string) (DecisionKeyRow, bool, error) {
	id := wire.DecisionKeyID(pub)
	tag, err := q.Exec(ctx, `INSERT INTO decision_keys (key_id, public_key, valid_from, note) VALUES ($1, $2, $3, $4)
		ON CONFLICT DO NOTHING`, id, []byte(pub), validFrom, note)
	if err != nil {
		return DecisionKeyRow{}, false, fmt.Errorf("sink: register decision key %s: %w", id, interpretError(err))
	}
	k, err := scanDecisionKey(q.QueryRow(ctx, `SELECT `+decisionKeyColumns+` FROM decision_keys WHERE key_id = $1`, id))
	if err != nil {
		return DecisionKeyRow{}, false, fmt.Errorf("sink: read decision key %s: %w", id, interpretError(err))
	}
	switch {
	case !k.PublicKey.Equal(pub):
		return k, false, fmt.Errorf("%w: key id %s is registered with another public key", ErrDecisionKeyUnusable, id)
	case !k.RevokedAt.IsZero() && !now.Before(k.RevokedAt):
		return k, false, fmt.Errorf("%w: decision key %s was revoked at %s: give mandated another key (mandatectl decision-keys generate)", ErrDecisionKeyUnusable, id, k.RevokedAt.UTC().Format(time.RFC3339))
	case now.Before(k.ValidFrom):
		return k, false, fmt.Errorf("%w: decision key %s is valid from %s", ErrDecisionKeyUnusable, id, k.ValidFrom.UTC().Format(time.RFC3339))
	case !k.ValidUntil.IsZero() && !now.Before(k.ValidUntil):
		return k, false, fmt.Errorf("%w: decision key %s expired at %s", ErrDecisionKeyUnusable, id, k.ValidUntil.UTC().Format(time.RFC3339))
	}
	return k, tag.RowsAffected() == 1, nil
}

// ErrDecisionKeyExists says a decision key is already registered.
var ErrDecisionKeyExists = errors.New("sink: decision key already registered")

// AddDecisionKey registers a key with its window (an operator's add).
func AddDecisionKey(ctx context.Context, q KeyQuerier, pub ed25519.PublicKey, validFrom, validUntil time.Time, note string) (string, error) {
	if len(pub) != ed25519.PublicKeySize {
		return "", fmt.Errorf("sink: not an Ed25519 public key (%d bytes)", len(pub))
	}
	id := wire.DecisionKeyID(pub)
	var until *time.Time
	if !validUntil.IsZero() {
		until = &validUntil
	}
	_, err := q.Exec(ctx, `INSERT INTO decision_keys (key_id, public_key, valid_from, valid_until, note) VALUES ($1, $2, $3, $4, $5)`,
		id, []byte(pub), validFrom, until, note)
	if pgerr.Is(err, pgerr.UniqueViolation) {
		return id, fmt.Errorf("%w: %s", ErrDecisionKeyExists, id)
	}
	if err != nil {
		return id, fmt.Errorf("sink: add decision key: %w", interpretError(err))
	}
	return id, nil
}

// RevokeDecisionKey marks a key revoked as of at: the records it signed at
// or after at do not count (a key retired by a rotation, or one that
// leaked). A key already revoked keeps its first revocation time.
func RevokeDecisionKey(ctx context.Context, q KeyQuerier, keyID string, at time.Time) error {
	tag, err := q.Exec(ctx, `UPDATE decision_keys SET revoked_at = coalesce(revoked_at, $2) WHERE key_id = $1`, keyID, at)
	if err != nil {
		return fmt.Errorf("sink: revoke decision key: %w", interpretError(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: decision key %s", ErrNotFound, keyID)
	}
	return nil
}

// DecisionKeyCache is the registered decision keys, read from PostgreSQL
// and kept: a key id it does not know reloads them (at most once per
// MinReload), and they are read again every Refresh, so a key registered
// by a member that just started verifies at once and a revocation takes
// effect within Refresh.
type DecisionKeyCache struct {
	pool      *pgxpool.Pool
	refresh   time.Duration
	minReload time.Duration
	timeout   time.Duration

	mu       sync.Mutex
	keys     wire.DecisionKeys
	loaded   time.Time
	tried    time.Time
	lastErr  error
	fetching chan struct{}
}

var _ wire.DecisionKeyring = (*DecisionKeyCache)(nil)

// Defaults of NewDecisionKeyCache.
const (
	DecisionKeyRefreshDefault   = time.Minute
	DecisionKeyMinReloadDefault = time.Second
)

// NewDecisionKeyCache reads the keys of the database pool reaches (the
// control shard) when first asked.
func NewDecisionKeyCache(pool *pgxpool.Pool) *DecisionKeyCache {
	return &DecisionKeyCache{pool: pool, refresh: DecisionKeyRefreshDefault, minReload: DecisionKeyMinReloadDefault, timeout: 5 * time.Second}
}

// DecisionKey returns the key keyID, reloading the keys when it is not
// known (or the keys are older than the refresh interval).
func (c *DecisionKeyCache) DecisionKey(keyID string) (wire.DecisionKey, bool) {
	c.mu.Lock()
	k, ok := c.keys[keyID]
	stale := time.Since(c.loaded) >= c.refresh
	canReload := time.Since(c.tried) >= c.minReload
	c.mu.Unlock()
	if (ok && !stale) || !canReload {
		return k, ok
	}
	c.reload()
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok = c.keys[keyID]
	return k, ok
}

// Err is the error of the last read that failed (nil after one that did
// not).
func (c *DecisionKeyCache) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// reload reads the keys again; concurrent callers wait for one read.
func (c *DecisionKeyCache) reload() {
	c.mu.Lock()
	if ch := c.fetching; ch != nil {
		c.mu.Unlock()
		<-ch
		return
	}
	ch := make(chan struct{})
	c.fetching, c.tried = ch, time.Now()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	keys, err := LoadDecisionKeys(ctx, c.pool)
	cancel()
	c.mu.Lock()
	if err == nil {
		c.keys, c.loaded = keys, time.Now()
	}
	c.lastErr = err
	c.fetching = nil
	c.mu.Unlock()
	close(ch)
}

// RegisterSigner registers the key mandated signs with (the relay's) in
// this database (the control shard), at start: a key the database does
// not know is added, valid from the start of time (it signed nothing
// before; an operator who registers keys ahead sets their windows with
// mandatectl decision-keys add), one it knows must be valid now.
func (s *Sink) RegisterSigner(ctx context.Context, signer *wire.RecordSigner, owner string) error {
	s = s.settings()
	k, added, err := RegisterDecisionKey(ctx, s.pool, signer.PublicKey(), time.Unix(0, 0).UTC(), time.Now(),
		"registered by mandated "+owner+" at start")
	if err != nil {
		return err
	}
	s.log.Info().Str("decision_key", k.KeyID).Bool("added", added).
		Msg("signing published records with this decision key; a key mandated registers at start is unknown to a backup taken before it: register production keys ahead (mandatectl decision-keys add)")
	return nil
}
