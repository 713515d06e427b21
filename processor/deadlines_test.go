package processor

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
)

func TestTheDeadlineQueueReturnsDueKeysEarliestFirstAndForgetsDroppedOnes(t *testing.T) {
	t.Parallel()
	q := newDeadlineQueue()
	t0 := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	key := func(i int) lifecycle.AuthKey {
		return lifecycle.AuthKey{Mandate: partitioner.MandateKey{Org: "o", MandateID: "m"}, ID: fmt.Sprint("a", i)}
	}
	r := rand.New(rand.NewPCG(1, 1))
	want := map[lifecycle.AuthKey]time.Time{}
	for i := range 500 {
		at := t0.Add(time.Duration(r.IntN(1000)) * time.Second)
		q.set(key(i), at)
		want[key(i)] = at
	}
	for i := 0; i < 500; i += 7 { // moved (a begin sets the execution deadline)
		at := t0.Add(time.Duration(r.IntN(1000)) * time.Second)
		q.set(key(i), at)
		want[key(i)] = at
	}
	for i := 3; i < 500; i += 11 {
		q.drop(key(i))
		delete(want, key(i))
	}
	require.Equal(t, len(want), q.len())
	next, ok := q.next()
	require.True(t, ok)
	var got []lifecycle.AuthKey
	for _, k := range q.due(t0.Add(500*time.Second), 1000) {
		got = append(got, k)
	}
	var expect []lifecycle.AuthKey
	for k, at := range want {
		if !at.After(t0.Add(500 * time.Second)) {
			expect = append(expect, k)
		}
	}
	require.ElementsMatch(t, expect, got)
	for i := 1; i < len(got); i++ {
		require.False(t, want[got[i]].Before(want[got[i-1]]), "earliest first")
	}
	earliest := t0.Add(time.Hour)
	for _, at := range want {
		if at.Before(earliest) {
			earliest = at
		}
	}
	require.Equal(t, earliest, next)
	require.Equal(t, len(want)-len(got), q.len())
	rest := q.due(t0.Add(2000*time.Second), 3)
	require.Len(t, rest, 3, "bounded by max")
}
