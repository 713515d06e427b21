package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The relay's producer retries after the configured base, doubling per
// consecutive failure up to RetryBackoffMax, not after franz-go's 250 ms
// that doubles to 5 s (what delayed the first decisions after a start).
func TestTheRelayRetryBackoffStartsAtItsBaseDoublesAndIsCappedAtOneSecond(t *testing.T) {
	none := func() float64 { return 1 }
	b := retryBackoff(RetryBackoffDefault, none)
	require.Equal(t, 10*time.Millisecond, b(1))
	require.Equal(t, 20*time.Millisecond, b(2))
	require.Equal(t, 40*time.Millisecond, b(3))
	require.Equal(t, 640*time.Millisecond, b(7))
	require.Equal(t, RetryBackoffMax, b(8))
	require.Equal(t, RetryBackoffMax, b(1000))
	require.Equal(t, RetryBackoffMax, retryBackoff(3*time.Second, none)(1), "a base above the cap is capped")

	low := retryBackoff(100*time.Millisecond, func() float64 { return 0.8 })
	require.Equal(t, 80*time.Millisecond, low(1), "jitter scales the backoff")
	for range 1000 {
		j := jitter()
		require.True(t, j >= 0.8 && j < 1.2, "jitter %v outside [0.8, 1.2)", j)
	}
}

func TestRetryBackoffDefaultsToTenMillisecondsAndNegativeKeepsFranzGosDefault(t *testing.T) {
	require.Equal(t, RetryBackoffDefault, Config{}.WithDefaults().RetryBackoff)
	require.Equal(t, -time.Nanosecond, Config{RetryBackoff: -time.Nanosecond}.WithDefaults().RetryBackoff)
}
