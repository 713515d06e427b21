package processor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
)

func TestOrphansAreThePartitionsALiveHolderSaysItHandedOffAndNobodyDecides(t *testing.T) {
	t.Parallel()
	const fresh = 5 * time.Second
	parts := []int32{2, 3, 4, 5, 6, 7} // shard b's
	cut := sink.Member{Owner: "cut", Age: time.Second, Deciding: []int32{0, 1}, Assigned: []int32{0, 1, 2, 3}, Cut: []string{"b"}}
	for _, tc := range []struct {
		name     string
		here     []sink.Member   // shard b's rows
		answered [][]sink.Member // every answering shard's rows
		want     []int32
	}{
		{
			name:     "a holder seen on shard a that says it handed shard b off: its partitions of b are orphans",
			here:     []sink.Member{{Owner: "cut", Age: 11 * time.Second, Deciding: []int32{0, 1, 2, 3}}, {Owner: "me", Deciding: []int32{4, 5, 6, 7}}},
			answered: [][]sink.Member{{cut}},
			want:     []int32{2, 3},
		},
		{
			name:     "a holder that says nothing is cut keeps its partitions, however long it has not been seen here",
			here:     []sink.Member{{Owner: "slow", Age: time.Minute, Deciding: []int32{2, 3}}},
			answered: [][]sink.Member{{{Owner: "slow", Age: time.Second, Deciding: []int32{0, 2, 3}, Assigned: []int32{0, 2, 3}}}},
		},
		{
			name:     "a holder seen nowhere lately is gone or restarting: the consumer group's business",
			answered: [][]sink.Member{{{Owner: "gone", Age: 6 * time.Second, Assigned: []int32{2, 3}, Cut: []string{"b"}}}},
		},
		{
			name: "a partition another processor the shard sees decides (an adopter, or the holder back) is no orphan",
			here: []sink.Member{{Owner: "adopter", Age: time.Second, Deciding: []int32{2}},
				{Owner: "old-adopter", Age: 6 * time.Second, Deciding: []int32{3}}},
			answered: [][]sink.Member{{cut}},
			want:     []int32{3},
		},
		{
			name:     "only the shard's partitions, and only a cut of this shard",
			answered: [][]sink.Member{{{Owner: "x", Age: time.Second, Assigned: []int32{0, 1, 5, 9}, Cut: []string{"a", "b"}}, {Owner: "y", Age: time.Second, Assigned: []int32{6}, Cut: []string{"a"}}}},
			want:     []int32{5},
		},
		{
			name:     "what this processor itself says is never an orphan to it",
			answered: [][]sink.Member{{{Owner: "me", Age: 0, Assigned: []int32{2}, Cut: []string{"b"}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, orphans(parts, "b", tc.here, tc.answered, "me", fresh))
		})
	}
}
