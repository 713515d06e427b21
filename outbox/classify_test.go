package outbox

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
)

func TestOnlyRecordErrorsNoRetryCanFixAreReasonsToPark(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		park bool
	}{
		{kerr.MessageTooLarge, true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidRecord, true},
		// A corrupt message is a checksum that failed on the way: sending
		// the same bytes again succeeds.
		{kerr.CorruptMessage, false},
		{kerr.NotLeaderForPartition, false},
		{kerr.RequestTimedOut, false},
	} {
		t.Run(c.err.(*kerr.Error).Message, func(t *testing.T) {
			require.Equal(t, c.park, refusedForGood(fmt.Errorf("produce: %w", c.err)))
		})
	}
}
