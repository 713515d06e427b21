package owned_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/internal/owned"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGroup(t *testing.T) {
	t.Parallel()

	t.Run("an empty group's wait returns at once", func(t *testing.T) {
		t.Parallel()
		var g owned.Group
		require.NoError(t, g.Wait(t.Context()))
		require.Zero(t, g.Running())
	})

	t.Run("wait returns once every goroutine ended, including one started by another while it waited", func(t *testing.T) {
		t.Parallel()
		var g owned.Group
		release, started := make(chan struct{}), make(chan struct{})
		g.Go(func() {
			<-release
			g.Go(func() { <-started })
		})
		waited := make(chan error, 1)
		go func() { waited <- g.Wait(context.Background()) }()
		close(release)
		select {
		case err := <-waited:
			t.Fatalf("wait returned (%v) while the second goroutine runs", err)
		case <-time.After(50 * time.Millisecond):
		}
		require.NotZero(t, g.Running())
		close(started)
		select {
		case err := <-waited:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("wait did not return after every goroutine ended")
		}
		require.Zero(t, g.Running())
	})

	t.Run("wait gives up with the context's error when the context ends first", func(t *testing.T) {
		t.Parallel()
		var g owned.Group
		stop := make(chan struct{})
		g.Go(func() { <-stop })
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, g.Wait(ctx), context.DeadlineExceeded)
		require.Equal(t, 1, g.Running(), "the goroutine goes on")
		close(stop)
		require.NoError(t, g.Wait(t.Context()))
	})
}
