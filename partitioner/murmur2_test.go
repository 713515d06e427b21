package partitioner

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Vectors from Apache Kafka's own UtilsTest.testMurmur2
// (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
func TestMurmur2MatchesKafkaVectors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   []byte
		want int32
	}{
		{[]byte("21"), -973932308},
		{[]byte("foobar"), -790332482},
		{[]byte("a-little-bit-long-string"), -985981536},
		{[]byte("a-little-bit-longer-string"), -1486304829},
		{[]byte("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58897971},
		{[]byte{'a', 'b', 'c'}, 479470107},
		{[]byte{12, 42, 56, 24, 109, 111}, 274204207},
	}
	for _, c := range cases {
		require.Equal(t, c.want, Murmur2(c.in), "murmur2(%q)", c.in)
	}
}

func TestToPositiveIsNotAbs(t *testing.T) {
	t.Parallel()
	require.Equal(t, int32(0), ToPositive(-2147483648))
	require.Equal(t, int32(1357151166), ToPositive(-790332482))
	require.Equal(t, int32(6), ForKey([]byte("foobar"), 10))
}

// franz-go's default keyed partitioner is documented to match the Java
// client; a second, independent implementation must agree with ours for
// every key and partition count we use.
func TestForKeyAgreesWithFranzGoKeyedPartitioner(t *testing.T) {
	t.Parallel()
	p := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for n := 1; n <= 64; n *= 2 {
		for i := range 500 {
			key := []byte(fmt.Sprintf("org-%d/mandate-%d", i%7, i))
			want := p.Partition(&kgo.Record{Key: key}, n)
			require.Equal(t, int32(want), ForKey(key, int32(n)), "key %s n %d", key, n)
		}
	}
}

func TestMandateKeyGrammar(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   string
		ok   bool
	}{
		{"a plain key parses", "acme/case-1842", true},
		{"ids may carry dots colons and underscores", "acme/refund:1842_a.b", true},
		{"a key without a slash is refused", "acme", false},
		{"an upper-case org is refused", "Acme/case-1", false},
		{"an empty mandate id is refused", "acme/", false},
		{"a second slash is refused", "acme/a/b", false},
		{"a zero-width space is refused", "acme/mandate\u200b1", false},
		{"a Cyrillic letter is refused", "acme/m\u0430ndate", false},
		{"a NUL byte is refused", "acme/a\x00b", false},
		{"a leading dash is refused", "acme/-x", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, err := ParseMandateKey(c.in)
			if c.ok {
				require.NoError(t, err)
				require.Equal(t, c.in, k.String())
			} else {
				require.ErrorIs(t, err, ErrInvalidKey)
			}
		})
	}
}
