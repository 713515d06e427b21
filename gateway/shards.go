package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/sink/shardmap"
)

// Shards is the gateway's view of mandated's shard map: the database that
// holds each partition's rows, so a status read goes to one database (the
// mandate's partition's, by the partitioner and the map), not to every
// shard in turn. Reload reads the map file again (on SIGHUP, on a poll of
// the file, and when a shard says a partition moved away), as the
// processors do.
type Shards struct {
	path string
	open func(ctx context.Context, url string) (*pgxpool.Pool, error)
	log  zerolog.Logger

	reloadMu sync.Mutex
	opened   map[string]*pgxpool.Pool // every pool opened, by URL; closed by Close
	control  string                   // the control shard's name: it changes only with a restart
	layout   atomic.Pointer[shardLayout]
	reloads  func(result string)
}

type shardLayout struct {
	raw   []byte
	m     *shardmap.Map
	pools []*pgxpool.Pool // index-aligned with m.Shards
}

// OpenShards reads the shard map at path and opens a pool per shard with
// open (lazily connecting, read-only sessions: the caller's choice).
func OpenShards(ctx context.Context, path string, open func(ctx context.Context, url string) (*pgxpool.Pool, error), log zerolog.Logger) (*Shards, error) {
	sh := &Shards{path: path, open: open, log: log.With().Str("component", "gateway").Logger(), opened: map[string]*pgxpool.Pool{},
		reloads: func(string) {}}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gateway: read the shard map: %w", err)
	}
	l, err := sh.parse(ctx, b)
	if err != nil {
		sh.Close()
		return nil, err
	}
	sh.control = l.m.Shards[l.m.Control()].Name
	sh.layout.Store(l)
	return sh, nil
}

func (sh *Shards) parse(ctx context.Context, b []byte) (*shardLayout, error) {
	m, err := shardmap.Parse(b)
	if err != nil {
		return nil, err
	}
	l := &shardLayout{raw: b, m: m}
	for _, s := range m.Shards {
		pool, ok := sh.opened[s.URL]
		if !ok {
			if pool, err = sh.open(ctx, s.URL); err != nil {
				return nil, fmt.Errorf("gateway: shard %s: %w", s.Name, err)
			}
			sh.opened[s.URL] = pool
		}
		l.pools = append(l.pools, pool)
	}
	return l, nil
}

// Control is the control shard's pool: where the gateway tokens and the
// partition count are.
func (sh *Shards) Control() *pgxpool.Pool {
	l := sh.layout.Load()
	return l.pools[l.m.Control()]
}

// Pools returns every shard's pool, as the map last read says (the
// console reads across all of them).
func (sh *Shards) Pools() []*pgxpool.Pool {
	l := sh.layout.Load()
	return append([]*pgxpool.Pool(nil), l.pools...)
}

// For returns the pool and the name of the shard that owns partition p as
// the map last read says (the control shard's for a partition no shard
// names: reads there find nothing).
func (sh *Shards) For(p int32) (*pgxpool.Pool, string) {
	l := sh.layout.Load()
	i := l.m.For(p)
	if i < 0 {
		i = l.m.Control()
	}
	return l.pools[i], l.m.Shards[i].Name
}

// ErrControlShardChanged refuses a reloaded map whose control shard is
// another one: the gateway's tokens are there, and it changes only with a
// restart.
var ErrControlShardChanged = errors.New("gateway: the reloaded shard map names another control shard")

// Reload reads the map file again and routes by it from now on when it
// changed. A map that does not parse, or names another control shard, is
// not used (the old one stays). Shards the map adds are opened; pools of
// shards it drops stay open until Close.
func (sh *Shards) Reload(ctx context.Context) (bool, error) {
	sh.reloadMu.Lock()
	defer sh.reloadMu.Unlock()
	b, err := os.ReadFile(sh.path)
	if err != nil {
		sh.reloads("error")
		return false, fmt.Errorf("gateway: read the shard map: %w", err)
	}
	if bytes.Equal(b, sh.layout.Load().raw) {
		return false, nil
	}
	l, err := sh.parse(ctx, b)
	if err == nil && l.m.Shards[l.m.Control()].Name != sh.control {
		err = fmt.Errorf("%w: %s, not %s", ErrControlShardChanged, l.m.Shards[l.m.Control()].Name, sh.control)
	}
	if err != nil {
		sh.reloads("error")
		sh.log.Error().Err(err).Str("path", sh.path).Msg("the shard map changed but cannot be used: still routing by the previous one")
		return false, err
	}
	old := sh.layout.Swap(l)
	sh.reloads("reloaded")
	for _, s := range l.m.Shards {
		for _, o := range old.m.Shards {
			if o.Name == s.Name && o.Range() != s.Range() {
				sh.log.Info().Str("shard", s.Name).Str("was", o.Range()).Str("partitions", s.Range()).Msg("shard map reloaded: the shard's partitions changed")
			}
		}
	}
	sh.log.Info().Str("path", sh.path).Int("shards", len(l.m.Shards)).Msg("shard map reloaded")
	return true, nil
}

// ping checks every shard of the map answers.
func (sh *Shards) ping(ctx context.Context) error {
	l := sh.layout.Load()
	for i, pool := range l.pools {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("postgresql shard %s: %w", l.m.Shards[i].Name, err)
		}
	}
	return nil
}

// Close closes every pool the map opened.
func (sh *Shards) Close() {
	sh.reloadMu.Lock()
	defer sh.reloadMu.Unlock()
	for url, pool := range sh.opened {
		pool.Close()
		delete(sh.opened, url)
	}
}
