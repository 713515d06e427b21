package shardmap_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink/shardmap"
)

// TestTheShardMapLockExcludesASecondEditorUntilReleased: a second editor
// of the map waits (told who holds it) until the first unlocks, gives up
// when its context ends, and the temporary files of an editor that died
// before its rename are removed by the next holder.
func TestTheShardMapLockExcludesASecondEditorUntilReleased(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "shards.yaml")
	require.NoError(t, os.WriteFile(path, []byte("shards: []\n"), 0o644))
	stale := filepath.Join(dir, ".shards.yaml.12345")
	require.NoError(t, os.WriteFile(stale, []byte("url: postgres://u:secret@h/db\n"), 0o600))
	other := filepath.Join(dir, ".shards.yaml.bak.1") // another file's, not ours
	require.NoError(t, os.WriteFile(other, nil, 0o600))

	first, err := shardmap.Lock(context.Background(), path, nil)
	require.NoError(t, err)
	require.NoFileExists(t, stale, "a dead editor's temporary map is removed")
	require.FileExists(t, other)
	require.FileExists(t, shardmap.LockPath(path))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var holder string
	_, err = shardmap.Lock(ctx, path, func(h string) { holder = h })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, holder, "pid ", "the waiting editor is told who holds the lock")

	waited := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		second, err := shardmap.Lock(context.Background(), path, func(string) { close(waited) })
		if err == nil {
			err = second.Unlock()
		}
		got <- err
	}()
	<-waited
	select {
	case err := <-got:
		t.Fatalf("the second editor got the lock while the first holds it (%v)", err)
	default:
	}
	require.NoError(t, first.Unlock())
	require.NoError(t, <-got, "the second editor gets the lock once the first releases it")
}

func TestRedactSecretsHidesEveryPasswordOfAConnectionString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://mandated:s3cret@db:5432/x?sslmode=verify-full", "postgres://mandated:***@db:5432/x?sslmode=verify-full"},
		{`url: "postgresql://u:p%40ss@h/db"`, `url: "postgresql://u:***@h/db"`},
		{"cannot parse `postgres://u:pw@h:notaport/x`: bad port", "cannot parse `postgres://u:***@h:notaport/x`: bad port"},
		{"host=db user=u password=s3cret dbname=x", "host=db user=u password=*** dbname=x"},
		{"host=db password='s3 cret' dbname=x", "host=db password=*** dbname=x"},
		{"postgres://u@h/db?password=s3cret&sslmode=disable", "postgres://u@h/db?password=***&sslmode=disable"},
		{"postgres://u@h/db and shard b", "postgres://u@h/db and shard b"},
		{"partition 1 moved from shard a to shard b", "partition 1 moved from shard a to shard b"},
	} {
		require.Equal(t, c.want, shardmap.RedactSecrets(c.in), c.in)
	}
}
