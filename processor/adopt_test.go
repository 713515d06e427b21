package processor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
)

func TestOrphansAreThePartitionsOfAHolderCutFromTheShardAlone(t *testing.T) {
	t.Parallel()
	const stale, fresh = 10 * time.Second, 5 * time.Second
	parts := []int32{2, 3, 4, 5, 6, 7}
	for _, tc := range []struct {
		name      string
		here      []sink.Member
		elsewhere map[string]time.Duration
		want      []int32
	}{
		{
			name:      "a holder not seen here for the bound but seen on another shard is cut from this one: its partitions are orphans",
			here:      []sink.Member{{Owner: "cut", Age: 11 * time.Second, Holding: []int32{2, 3}}, {Owner: "me", Age: 0, Holding: []int32{4, 5, 6, 7}}},
			elsewhere: map[string]time.Duration{"cut": time.Second, "me": 0},
			want:      []int32{2, 3},
		},
		{
			name:      "a holder seen nowhere is gone or restarting: the consumer group's business",
			here:      []sink.Member{{Owner: "gone", Age: 11 * time.Second, Holding: []int32{2, 3}}},
			elsewhere: map[string]time.Duration{"gone": 11 * time.Second},
		},
		{
			name:      "a holder seen here within the bound keeps its partitions, however slow its probes",
			here:      []sink.Member{{Owner: "slow", Age: 9 * time.Second, Holding: []int32{2, 3}}},
			elsewhere: map[string]time.Duration{"slow": 0},
		},
		{
			name: "a partition someone seen here holds (an adopter, or the holder back) is no orphan",
			here: []sink.Member{{Owner: "cut", Age: 30 * time.Second, Holding: []int32{2, 3}},
				{Owner: "adopter", Age: time.Second, Holding: []int32{2}}},
			elsewhere: map[string]time.Duration{"cut": time.Second},
			want:      []int32{3},
		},
		{
			name:      "a holder's row lists only partitions of this shard that the map gives it now",
			here:      []sink.Member{{Owner: "cut", Age: 11 * time.Second, Holding: []int32{0, 3, 9}}},
			elsewhere: map[string]time.Duration{"cut": 0},
			want:      []int32{3},
		},
		{
			name:      "seen elsewhere, but not recently enough: dying, not cut",
			here:      []sink.Member{{Owner: "dying", Age: 11 * time.Second, Holding: []int32{2}}},
			elsewhere: map[string]time.Duration{"dying": 6 * time.Second},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, orphans(parts, tc.here, tc.elsewhere, stale, fresh))
		})
	}
}
