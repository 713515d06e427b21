package processor_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestAPartitionWhoseWorkerNeverGoesIdleStillPurgesExpiredKeys(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	busy := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	h := harness.New(t, harness.Options{Partitions: 1, Configure: func(c *processor.ServiceConfig) {
		c.Processor.Test.Clock = clk
		// Each kind of purge gets an eighth of the interval as its deadline:
		// at 100 ms (12.5 ms) a loaded CI machine cancelled every purge
		// query (a cancelled query closes its connection), and once the
		// first grant was not published within a minute; a second keeps
		// the purge's deadline above a loaded machine's query time.
		c.Processor.PurgeInterval = time.Second
		c.Processor.Test.OnCommitted = func(r processor.BatchReport) {
			for _, d := range r.Decisions {
				if d.MandateID == "busy" {
					// The worker is held inside its batch loop, as under a
					// load that never lets its inbox empty.
					busy <- struct{}{}
					<-release
				}
			}
		}
	}})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 1, nil))
	denied := h.SendAwait(propose("acme", "m", "expiring", 30000, nil))
	require.Equal(t, wire.ReasonAmountExceedsMax, denied.Reason, "a denial: its key is bound, with no authorization")

	h.Send(propose("acme", "busy", "hold-the-worker", 100, nil))
	<-busy
	clk.Set(t0.Add(31 * 24 * time.Hour)) // past the default retention
	testenv.WaitFor(t, 20*time.Second, func() bool { return !keyExists(t, db, "expiring") }, "the purge runs while the worker never goes idle")
	once.Do(func() { close(release) })
}
