package verify_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// verify checks every record's signature: records published before
// decision signatures (here: by a relay without the key) are counted, not
// broken; an unsigned record after signed ones on the partition cannot be
// mandated's, and is a break at its sequence.
func TestVerifyChecksEveryRecordsSignature(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	unsigned := func(c *processor.ServiceConfig) { c.Relay.Test.Unsigned = true }
	a := b.h.Start("a", unsigned)
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)
	b.h.Stop(a)
	rep := b.verify(t)
	require.True(t, rep.OK(), "%+v", rep)
	require.Equal(t, int64(1), rep.Partitions[0].Unsigned)

	a = b.h.Start("b")
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k1", 100)).Outcome)
	b.h.Stop(a)
	rep = b.verify(t)
	require.True(t, rep.OK(), "%+v", rep)
	require.Equal(t, int64(1), rep.Partitions[0].Unsigned, "a signed record is not counted")

	a = b.h.Start("c", unsigned)
	r := b.h.SendAwait(propose("acme", "m", "k2", 100))
	b.h.Stop(a)
	rep = b.verify(t)
	require.Len(t, rep.Breaks, 1, "%+v", rep.Breaks)
	require.Equal(t, verify.BreakSignature, rep.Breaks[0].Kind)
	require.Equal(t, r.Sequence, rep.Breaks[0].Sequence)
	require.Contains(t, rep.Breaks[0].Detail, "after signed records")
}
