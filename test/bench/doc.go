// Package bench is mandated's benchmark: `make bench` (test/bench/bench.sh)
// starts a Kafka broker and a PostgreSQL of its own, and cmd/benchrun
// measures mandated against baselines run on the same servers in the same
// run, interleaved, and writes a dated report under test/bench/results.
//
// The machine it runs on is shared and noisy, so every figure that matters
// is a ratio of two measurements taken next to each other (A B A B …), and
// the report gives the median of the per-pair ratios with their spread.
//
// It owns its servers, databases and topics; it never touches the test
// servers. Nothing here is imported by mandated itself.
package bench
