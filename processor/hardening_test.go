package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// mandateVersion reads a mandate's stored version (0 if it does not exist).
func mandateVersion(t *testing.T, h *harness.Harness, key string) int64 {
	t.Helper()
	k, err := partitioner.ParseMandateKey(key)
	require.NoError(t, err)
	var v int64
	err = openPool(t, h.DatabaseURL).QueryRow(context.Background(),
		`SELECT coalesce((SELECT version FROM mandates WHERE org = $1 AND mandate_id = $2), 0)`, k.Org, k.MandateID).Scan(&v)
	require.NoError(t, err)
	return v
}

func TestEveryBadInputIsAnsweredWithItsReasonAndNeverStallsThePartition(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 5, nil))
	key := []byte("acme/m")
	home := partitioner.ForKey(key, h.Spec.Partitions)
	good := func(idem string) map[string]any { return propose("acme", "m", idem, 100, nil) }
	body := func(over map[string]any, drop ...string) []byte {
		cmd := good("bad")
		cmd["v"] = 1
		for k, v := range over {
			cmd[k] = v
		}
		for _, k := range drop {
			delete(cmd, k)
		}
		b, err := json.Marshal(cmd)
		require.NoError(t, err)
		return b
	}
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	cases := []struct {
		name   string
		key    []byte // nil: no record key
		value  []byte
		reason wire.Reason
		dead   bool // no mandate key can be read: a dead letter
	}{
		{"truncated JSON is malformed", key, []byte(`{"v":1,"amount":`), wire.ReasonMalformedJSON, false},
		{"trailing garbage is malformed", key, append(body(nil), []byte(" x")...), wire.ReasonMalformedJSON, false},
		{"an array is not a command", key, []byte(`[1,2]`), wire.ReasonMalformedJSON, false},
		{"an empty value is malformed", key, []byte(``), wire.ReasonMalformedJSON, false},
		{"malformed JSON without a key goes to the dead letters", nil, []byte(`{"v":`), wire.ReasonMalformedJSON, true},
		{"a literal NaN is malformed", key, []byte(`{"v":1,"type":"propose","amount":{"minor_units":NaN}}`), wire.ReasonMalformedJSON, false},
		{"an unknown schema version is answered", key, body(map[string]any{"v": 99}), wire.ReasonUnsupportedVersion, false},
		{"a missing schema version is answered", key, body(nil, "v"), wire.ReasonUnsupportedVersion, false},
		{"a string schema version is answered", key, body(map[string]any{"v": "1"}), wire.ReasonUnsupportedVersion, false},
		{"a missing amount is named", key, body(nil, "amount"), wire.ReasonMissingField, false},
		{"a missing idempotency key is named", key, body(nil, "idempotency_key"), wire.ReasonMissingField, false},
		{"an unknown field is refused", key, body(map[string]any{"admin": true}), wire.ReasonUnknownField, false},
		{"invalid UTF-8 is refused before decoding", key, []byte("{\"v\":1,\"type\":\"propose\",\"target\":\"\xff\"}"), wire.ReasonInvalidUTF8, false},
		{"a lone surrogate escape is refused", key, body(map[string]any{"target": "x"}), wire.ReasonInvalidUTF8, false},
		{"a NUL character is refused", key, []byte(`{"v":1,"type":"propose","org":"acme","mandate_id":"m","target":"a\u0000b"}`), wire.ReasonNULByte, false},
		{"a duplicate key is ambiguous", key, []byte(`{"v":1,"amount":1,"amount":2}`), wire.ReasonAmbiguousField, false},
		{"case-variant keys are ambiguous", key, []byte(`{"v":1,"amount":1,"Amount":2}`), wire.ReasonAmbiguousField, false},
		{"an oversized record is refused unread", key, []byte(`{"pad":"` + strings.Repeat("x", 70<<10) + `"}`), wire.ReasonTooLarge, false},
		{"deep nesting is too complex", key, []byte(deep), wire.ReasonTooComplex, false},
		{"a negative amount is invalid", key, body(map[string]any{"amount": map[string]any{"minor_units": -1, "currency": "EUR"}}), wire.ReasonAmountInvalid, false},
		{"a zero amount is invalid", key, body(map[string]any{"amount": map[string]any{"minor_units": 0, "currency": "EUR"}}), wire.ReasonAmountInvalid, false},
		{"a fractional amount is invalid", key, []byte(strings.Replace(string(body(nil)), `"minor_units":100`, `"minor_units":1.5`, 1)), wire.ReasonAmountInvalid, false},
		{"an overflowing amount is invalid", key, []byte(strings.Replace(string(body(nil)), `"minor_units":100`, `"minor_units":9223372036854775808`, 1)), wire.ReasonAmountInvalid, false},
		{"an exponent amount is invalid", key, []byte(strings.Replace(string(body(nil)), `"minor_units":100`, `"minor_units":1e309`, 1)), wire.ReasonAmountInvalid, false},
		{"a string amount is invalid", key, body(map[string]any{"amount": map[string]any{"minor_units": "100", "currency": "EUR"}}), wire.ReasonAmountInvalid, false},
		{"a lower-case currency is invalid", key, body(map[string]any{"amount": map[string]any{"minor_units": 100, "currency": "eur"}}), wire.ReasonCurrencyInvalid, false},
		{"a deadline in the past is refused", key, body(map[string]any{"deadline": "2001-01-01T00:00:00Z"}), wire.ReasonDeadlineInvalid, false},
		{"an absurdly far deadline is refused", key, body(map[string]any{"deadline": "2199-01-01T00:00:00Z"}), wire.ReasonDeadlineInvalid, false},
		{"a malformed deadline is refused", key, body(map[string]any{"deadline": "2026-13-40T99:99"}), wire.ReasonDeadlineInvalid, false},
		{"a malformed sent_at is refused", key, body(map[string]any{"sent_at": "yesterday"}), wire.ReasonTimestampInvalid, false},
		{"an id outside the grammar is refused", key, body(map[string]any{"target": "'); DROP TABLE mandates;--"}), wire.ReasonIDInvalid, false},
		{"a zero-width space in an id is refused", key, body(map[string]any{"idempotency_key": "k\u200b1"}), wire.ReasonIDInvalid, false},
		{"a key that disagrees with the body is refused", key, body(map[string]any{"mandate_id": "other"}), wire.ReasonKeyMismatch, false},
		{"a body claiming another org is refused", key, body(map[string]any{"org": "evil"}), wire.ReasonKeyMismatch, false},
		{"a record without a key is refused", nil, body(nil), wire.ReasonMissingRecordKey, false},
		{"a garbage key and body go to the dead letters", []byte("\x00\x01"), []byte(`{"v":1}`), wire.ReasonMissingField, true},
		{"a grant on the proposals topic is refused", key, mustJSON(t, withV(grant("acme", "m", 1000, nil))), wire.ReasonGrantOnProposals, false},
	}
	// The lone-surrogate case needs a raw escape json.Marshal will not write.
	for i := range cases {
		if cases[i].name == "a lone surrogate escape is refused" {
			cases[i].value = []byte(strings.Replace(string(cases[i].value), `"target":"x"`, `"target":"\ud800"`, 1))
		}
	}
	before := mandateVersion(t, h, "acme/m")
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := h.ProduceRaw(h.Spec.Proposals, c.key, c.value, home)
			next := h.Send(good(fmt.Sprintf("good-%d", i)))
			require.Equal(t, home, next.Partition)
			if c.dead {
				recs := h.Dead.WaitRecords(h.Timeout, func(rs []harness.Record) bool {
					for _, r := range rs {
						if r.Headers[wire.HeaderSourceOff] == fmt.Sprint(bad.Offset) {
							return true
						}
					}
					return false
				}, "the dead letter")
				for _, r := range recs {
					if r.Headers[wire.HeaderSourceOff] == fmt.Sprint(bad.Offset) {
						require.Equal(t, string(c.reason), r.Headers[wire.HeaderReason])
						require.Equal(t, h.Spec.Proposals, r.Headers[wire.HeaderSourceTopic])
						require.Equal(t, c.value[:min(len(c.value), wire.DeadLetterMaxByte)], r.Value)
					}
				}
			} else {
				d := h.Await(bad)
				require.Equal(t, wire.OutcomeRejected, d.Outcome, "%+v", d)
				require.Equal(t, c.reason, d.Reason, "%s", d.Detail)
			}
			n := h.Await(next)
			require.NotEqual(t, wire.OutcomeRejected, n.Outcome, "the next good record is decided: %+v", n)
		})
	}
	// Five good proposals used the five uses; everything else changed nothing.
	after := mandateVersion(t, h, "acme/m")
	require.Equal(t, before+5, after, "bad input never touched the mandate")
}

func withV(m map[string]any) map[string]any { m["v"] = 1; return m }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// librdkafkaPartition is librdkafka's "consistent" partitioner: CRC32 of
// the key. A producer using it sends many keys to the wrong partition.
func librdkafkaPartition(key []byte, n int32) int32 {
	return int32(crc32.ChecksumIEEE(key) % uint32(n))
}

func TestRecordsFromANonJavaPartitionerAreRejectedAndNeverWriteFromTheWrongPartition(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 4})
	h.Start("a")
	misrouted, routed := 0, 0
	for i := range 40 {
		mandate := fmt.Sprintf("m-%d", i)
		key := []byte("acme/" + mandate)
		p := librdkafkaPartition(key, 4)
		sent := h.ProduceRaw(h.Spec.Grants, key, mustJSON(t, withV(grant("acme", mandate, 1, nil))), p)
		d := h.Await(sent)
		home := partitioner.ForKey(key, 4)
		if p == home {
			routed++
			require.Equal(t, wire.OutcomeGranted, d.Outcome)
			continue
		}
		misrouted++
		require.Equal(t, wire.OutcomeRejected, d.Outcome)
		require.Equal(t, wire.ReasonMisrouted, d.Reason)
		require.Equal(t, home, *d.HomePartition)
		require.Equal(t, p, d.Partition, "answered where the producer sent it")
		require.Zero(t, mandateVersion(t, h, string(key)), "a misrouted grant wrote nothing")
	}
	require.Positive(t, misrouted)
	require.Positive(t, routed)
	t.Logf("CRC32 partitioner: %d of 40 keys misrouted", misrouted)
}

func TestOneOrgCannotReachAnotherOrgsAuthorization(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 1, nil))
	h.SendAwait(grant("evil", "m", 1, nil))
	r := h.SendAwait(propose("acme", "m", "k", 100, nil))
	require.Equal(t, wire.OutcomeReserved, r.Outcome)

	// evil names acme's authorization through its own mandate.
	for _, typ := range []string{"begin", "commit", "cancel"} {
		d := h.SendAwait(authCmd(typ, "evil", "m", r.AuthorizationID, map[string]any{"external_ref": "x"}))
		if typ != "commit" {
			d = h.SendAwait(authCmd(typ, "evil", "m", r.AuthorizationID, nil))
		}
		require.Equal(t, wire.OutcomeRefused, d.Outcome)
		require.Equal(t, wire.ReasonAuthorizationNotFound, d.Reason)
		require.Nil(t, d.Authorization, "nothing about acme's authorization is shown")
	}
	// The same idempotency key in another org is another intent.
	e := h.SendAwait(propose("evil", "m", "k", 100, nil))
	require.Equal(t, wire.OutcomeReserved, e.Outcome)
	require.NotEqual(t, r.AuthorizationID, e.AuthorizationID)
	c := h.SendAwait(authCmd("commit", "acme", "m", r.AuthorizationID, map[string]any{"external_ref": "re_1"}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "acme's authorization was untouched")
}

func TestTwoProcessorsDecideBothTopicsOfAPartitionAsOneWriterThroughARebalance(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 4})
	a := h.Start("a")
	const mandates = 6
	for i := range mandates {
		h.SendAwait(grant("acme", fmt.Sprintf("m%d", i), 1000, nil))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var proposals []harness.Sent
	revokes := map[string]harness.Sent{}
	for i := range mandates {
		mandate := fmt.Sprintf("m%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 30 {
				s := h.Send(propose("acme", mandate, fmt.Sprintf("%s-k%d", mandate, j), 1, nil))
				mu.Lock()
				proposals = append(proposals, s)
				mu.Unlock()
				if j == 15 {
					rv := h.Send(map[string]any{"type": "revoke", "org": "acme", "mandate_id": mandate})
					mu.Lock()
					revokes[mandate] = rv
					mu.Unlock()
				}
			}
		}()
	}
	b := h.Start("b") // a rebalance in the middle of the race
	wg.Wait()
	revokedAt := map[string]int64{}
	for mandate, s := range revokes {
		d := h.Await(s)
		require.Equal(t, wire.OutcomeRevoked, d.Outcome)
		revokedAt["acme/"+mandate] = d.Sequence
	}
	for _, s := range proposals {
		d := h.Await(s)
		if d.Sequence > revokedAt[d.MandateKey] {
			require.Equal(t, wire.ReasonMandateRevoked, d.Reason, "nothing reserved after the revoke in commit order: %+v", d)
		} else {
			require.Equal(t, wire.OutcomeReserved, d.Outcome)
		}
	}
	// Ownership is disjoint at every look and, once the incremental
	// assignment has settled, complete.
	testWaitFor(t, func() bool {
		owned := map[int32]string{}
		for _, in := range []*harness.Instance{a, b} {
			for p := range in.Service.Processor.Owned() {
				require.NotContains(t, owned, p, "partition %d owned twice", p)
				owned[p] = in.Name
			}
		}
		return len(owned) == 4
	}, "every partition owned by one processor")
}
