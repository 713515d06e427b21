package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMetadataMinAgeDefaultsToAHundredMillisecondsAndIsAtLeastFranzGosFloor(t *testing.T) {
	require.Equal(t, MetadataMinAgeDefault, Config{}.WithDefaults().MetadataMinAge)
	require.Equal(t, -time.Nanosecond, Config{MetadataMinAge: -time.Nanosecond}.WithDefaults().MetadataMinAge)
	require.Error(t, Config{Brokers: []string{"x"}, MetadataMinAge: time.Millisecond}.WithDefaults().Validate())
	require.NoError(t, Config{Brokers: []string{"x"}}.WithDefaults().Validate())
}
