package mcpguard

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
)

func TestNumbersOfOneValueAreWrittenOneWay(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"12345": "12345", "12345.0": "12345", "1.2345e4": "12345", "123450e-1": "12345", "1.2345E+4": "12345",
		"0": "0", "-0": "0", "0.0": "0", "-0.0e5": "0", "-12": "-12", "-12.00": "-12",
		"1.50": "15e-1", "0.15e1": "15e-1", "0.001": "1e-3", "1e39": "1" + strings.Repeat("0", 39), "1e40": "1e40",
		"1e99999999999999999999": "1e99999999999999999999",
	} {
		require.Equal(t, want, normNumber(in), in)
	}
}

func TestAMetaIntentsActionNamesTheTarget(t *testing.T) {
	t.Parallel()
	require.Equal(t, "mcp.refund:order-7", metaAction("refund", "order-7"))
	require.Equal(t, "mcp.create-refund:order-7", metaAction("create_refund", "order-7"))
	long := metaAction(strings.Repeat("t", 200), "x")
	require.True(t, partitioner.ValidID(long), long)
	for _, target := range []string{"customer 77", strings.Repeat("o", 200), "ümlaut"} {
		a := metaAction("refund", target)
		require.True(t, partitioner.ValidID(a), "%q -> %q", target, a)
		require.True(t, strings.HasPrefix(a, "mcp.refund:sha256-"), a)
	}
	require.NotEqual(t, metaAction("refund", "a b"), metaAction("refund", "a  b"))
}
