package bench

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// The burn-down's exactly-once check reads each decision's idempotency key
// (the preloaded "<tag>-<i>") and must tell a missing, a doubled and a
// foreign decision apart.
func TestExactlyOnceCountsMissingDuplicatedAndForeignDecisions(t *testing.T) {
	b, err := os.ReadFile("../../wire/testdata/examples/decision.json")
	require.NoError(t, err)
	require.Equal(t, -1, idemIndex(b, idemField), "the example's key ends in a word, not an index")

	decision := func(key string) []byte {
		return []byte(`{"v":1,"decision_id":"3-9","idempotency_key":"` + key + `","authorization":{"idempotency_key":"other-0"}}`)
	}
	e := newExactlyOnce(4)
	for _, k := range []string{"bs1-0", "bs1-1m-1", "bs1-3", "bs1-3", "bs1-4", "bs1-x"} {
		e.add(decision(k))
	}
	require.Equal(t, 1, e.missing(), "proposal 2 has no decision")
	require.EqualValues(t, 1, e.dups.Load(), "proposal 3 was answered twice")
	require.EqualValues(t, 2, e.foreign.Load(), "index 4 is past the preload, x is no index")
}

// The child runs over the same shard map cmd/mandated reads from a file.
func TestServeConfigShardsBecomeAValidatedShardMapWithTheFirstShardAsControl(t *testing.T) {
	cfg := ServeConfig{Shards: []ServeShard{{Name: "b", Partitions: "4-7", URL: "postgres://b"}, {Name: "a", Partitions: "0-3", URL: "postgres://a"}}}
	m, err := cfg.shardMap()
	require.NoError(t, err)
	require.Equal(t, "a", m.Shards[m.Control()].Name)
	require.Equal(t, 1, m.For(7))
	require.Equal(t, 0, m.For(3))

	cfg.Shards[0].Partitions = "5-7"
	_, err = cfg.shardMap()
	require.ErrorContains(t, err, "no shard owns partitions 4-4")

	m, err = ServeConfig{DatabaseURL: "postgres://x"}.shardMap()
	require.NoError(t, err)
	require.Nil(t, m)
}
