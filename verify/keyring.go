package verify

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/sink"
)

// loadKeyring reads every grantor key and org signing mode (from the
// control shard with a shard map).
func loadKeyring(ctx context.Context, pool *pgxpool.Pool) (*sink.Keyring, error) {
	ring := &sink.Keyring{Keys: map[string]map[string]sink.GrantorKey{}}
	keys, err := sink.GrantorKeys(ctx, pool, "")
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if ring.Keys[k.Org] == nil {
			ring.Keys[k.Org] = map[string]sink.GrantorKey{}
		}
		ring.Keys[k.Org][k.KeyID] = k
	}
	if ring.Modes, err = sink.SigningModes(ctx, pool); err != nil {
		return nil, err
	}
	return ring, nil
}
