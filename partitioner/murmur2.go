package partitioner

// Murmur2 is the 32-bit murmur2 hash exactly as the Kafka Java client
// computes it (org.apache.kafka.common.utils.Utils.murmur2, seed 0x9747b28c).
// Other clients (librdkafka's default "consistent_random", for one) hash
// differently; that is why the processor recomputes every record's home
// partition instead of trusting the partition it arrived on.
func Murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	length := len(data)
	h := seed ^ uint32(length)
	n := length / 4
	for i := 0; i < n; i++ {
		j := i * 4
		k := uint32(data[j]) | uint32(data[j+1])<<8 | uint32(data[j+2])<<16 | uint32(data[j+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n*4:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// ToPositive clears the sign bit, as Kafka's Utils.toPositive does (it is
// not Math.abs: toPositive(MinInt32) is 0).
func ToPositive(h int32) int32 { return h & 0x7fffffff }

// ForKey returns the partition the Kafka Java client's default partitioner
// picks for a keyed record: toPositive(murmur2(key)) % partitions.
func ForKey(key []byte, partitions int32) int32 {
	if partitions <= 0 {
		panic("partitioner: partition count must be positive")
	}
	return ToPositive(Murmur2(key)) % partitions
}
