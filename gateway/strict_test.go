package gateway_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// kafkaRecord is what a producer on Kafka would send for the same command:
// the members the gateway takes from the URL and headers, then the body's
// members byte for byte. A body that is not an object stays as it is after
// them (and is as malformed on Kafka as over HTTP).
func kafkaRecord(typ, mandate, authID, key, body string) []byte {
	head := fmt.Sprintf(`{"v":1,"type":%q,"org":"acme","mandate_id":%q`, typ, mandate)
	if authID != "" {
		head += fmt.Sprintf(`,"authorization_id":%q`, authID)
	}
	if key != "" {
		head += fmt.Sprintf(`,"idempotency_key":%q`, key)
	}
	trimmed := strings.TrimLeft(body, " \t\r\n")
	switch {
	case strings.HasPrefix(trimmed, "{") && strings.HasPrefix(strings.TrimLeft(trimmed[1:], " \t\r\n"), "}"):
		return []byte(head + trimmed[1:])
	case strings.HasPrefix(trimmed, "{"):
		return []byte(head + "," + trimmed[1:])
	default:
		return []byte(head + "," + body)
	}
}

// The outside probe's bad bodies, and every other class the contract's
// decoder refuses, sent over HTTP and produced to Kafka as a record: the
// same reason both ways, and the gateway produces none of them.
func TestGatewayBadBodiesGetTheReasonsKafkaGives(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-strict", 5)
	const okPropose = `"operation":"payment.refund","amount":{"minor_units":100,"currency":"EUR"},"target":"t"`
	deep := `{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"t","intent":` +
		strings.Repeat(`{"a":`, 12) + `1` + strings.Repeat(`}`, 12) + `}`
	big := `{` + okPropose + `,"target2":"` + strings.Repeat("x", wire.MaxRecordBytesDefault) + `"}`
	for i, tc := range []struct {
		name    string
		command string // proposals, commit, cancel, begin
		body    string
		reason  wire.Reason
		status  int
	}{
		{"amount twice", "proposals", `{` + okPropose + `,"amount":{"minor_units":19999,"currency":"EUR"}}`, wire.ReasonAmbiguousField, 400},
		{"minor_units twice", "proposals", `{"operation":"payment.refund","amount":{"minor_units":1,"minor_units":19999,"currency":"EUR"},"target":"t"}`, wire.ReasonAmbiguousField, 400},
		{"operation twice", "proposals", `{"operation":"payment.refund",` + okPropose + `}`, wire.ReasonAmbiguousField, 400},
		{"a case variant of amount", "proposals", `{` + okPropose + `,"Amount":{"minor_units":19999,"currency":"EUR"}}`, wire.ReasonAmbiguousField, 400},
		{"a case variant of a URL member", "proposals", `{` + okPropose + `,"Org":"globex"}`, wire.ReasonAmbiguousField, 400},
		{"external_ref twice on commit", "commit", `{"external_ref":"re_1","external_ref":"re_2"}`, wire.ReasonAmbiguousField, 400},
		{"reason twice on cancel", "cancel", `{"reason":"a","reason":"b"}`, wire.ReasonAmbiguousField, 400},
		{"an unknown field", "proposals", `{` + okPropose + `,"admin":true}`, wire.ReasonUnknownField, 400},
		{"an unknown field of amount", "proposals", `{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR","fx":1},"target":"t"}`, wire.ReasonUnknownField, 400},
		{"a NUL in a string", "proposals", `{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"a\u0000b"}`, wire.ReasonNULByte, 400},
		{"a control character in a string", "cancel", `{"reason":"a\u0007b"}`, wire.ReasonControlChar, 400},
		{"bad UTF-8", "proposals", "{\"operation\":\"payment.refund\",\"amount\":{\"minor_units\":1,\"currency\":\"EUR\"},\"target\":\"\xff\"}", wire.ReasonInvalidUTF8, 400},
		{"a lone surrogate", "cancel", `{"reason":"\ud800"}`, wire.ReasonInvalidUTF8, 400},
		{"too deep", "proposals", deep, wire.ReasonTooComplex, 400},
		{"too big", "proposals", big, wire.ReasonTooLarge, 413},
		{"a byte-order mark", "proposals", "\xef\xbb\xbf{" + okPropose + "}", wire.ReasonMalformedJSON, 400},
		{"trailing data", "proposals", `{` + okPropose + `} {}`, wire.ReasonMalformedJSON, 400},
		{"an array", "proposals", `[1]`, wire.ReasonMalformedJSON, 400},
		{"a fractional amount", "proposals", `{"operation":"payment.refund","amount":{"minor_units":1.5,"currency":"EUR"},"target":"t"}`, wire.ReasonAmountInvalid, 400},
		{"an amount as a string", "proposals", `{"operation":"payment.refund","amount":{"minor_units":"100","currency":"EUR"},"target":"t"}`, wire.ReasonAmountInvalid, 400},
		{"an amount past 2^63", "proposals", `{"operation":"payment.refund","amount":{"minor_units":9223372036854775808,"currency":"EUR"},"target":"t"}`, wire.ReasonAmountInvalid, 400},
		{"a missing amount", "proposals", `{"operation":"payment.refund","target":"t"}`, wire.ReasonMissingField, 400},
		{"an executor on a commit", "commit", `{"external_ref":"re_1","executor":"w"}`, wire.ReasonUnknownField, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, authID, path := fmt.Sprintf("bad-%d", i), "", "/v1/orgs/acme/mandates/m-strict/proposals"
			typ := "propose"
			if tc.command != "proposals" {
				key, authID = "", "au_x"
				typ = tc.command
				path = "/v1/orgs/acme/mandates/m-strict/authorizations/au_x/" + tc.command
			}
			hs := map[string]string{}
			if key != "" {
				hs["Idempotency-Key"] = key
			}
			r := b.do(t, req{method: "POST", path: path, token: b.tokens["acme"], body: []byte(tc.body), headers: hs, invalid: true})
			p := r.problem(t, tc.status, tc.reason)
			require.Nil(t, p["decision"], "refused before producing: no decision")

			sent := b.h.ProduceRaw(b.h.Spec.Proposals, []byte("acme/m-strict"), kafkaRecord(typ, "m-strict", authID, key, tc.body), -1)
			d := b.h.Await(sent)
			require.Equal(t, wire.OutcomeRejected, d.Outcome, "%+v", d)
			require.Equal(t, tc.reason, d.Reason, "over Kafka: %s", d.Detail)
		})
	}

	// Nothing the gateway refused was produced: a good proposal sent last
	// on the same mandate (so the same partition, decided in order) is the
	// first decision under an HTTP request's key.
	ok := b.propose(t, "m-strict", "good-1", 100, nil)
	require.Equal(t, http.StatusOK, ok.status, "%s", ok.body)
	for _, d := range b.h.Decisions.All() {
		if d.Source != nil && d.Source.Topic == b.h.Spec.Proposals && d.MandateID == "m-strict" && d.Outcome != wire.OutcomeRejected {
			require.Equal(t, "good-1", d.IdempotencyKey, "only the good proposal was decided: %+v", d)
		}
	}
}
