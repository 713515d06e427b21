package wire_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// goodKey is the record key of every example: the mandate the bodies name.
const goodKey = "acme/refund-case-1842"

// noKey stands for a record without a key (a case's zero key means goodKey).
const noKey = "\x00no record key"

// exampleAuthID is the authorization the examples address: the one the
// propose example creates (see TestExamplesReplayThroughTheLifecycle).
const exampleAuthID = "au_jd4myjhey7qd2migc457x36r"

// member is one raw JSON object member. Bodies are built from ordered
// members so that duplicate and case-variant keys can be written at all.
type member struct{ k, v string }

var common = []member{{"v", `1`}, {"org", `"acme"`}, {"mandate_id", `"refund-case-1842"`}}

func base(typ string, fields ...member) []member {
	out := append([]member{{"type", `"` + typ + `"`}}, common...)
	return append(out, fields...)
}

var (
	grantBase = base("grant",
		member{"uses", `1`},
		member{"max_amount", `{"minor_units":20000,"currency":"EUR"}`},
		member{"operations", `["payment.refund"]`})
	revokeBase  = base("revoke")
	proposeBase = base("propose",
		member{"idempotency_key", `"intent-1"`},
		member{"operation", `"payment.refund"`},
		member{"amount", `{"minor_units":15000,"currency":"EUR"}`},
		member{"target", `"customer-77"`})
	beginBase   = base("begin", member{"authorization_id", `"` + exampleAuthID + `"`}, member{"executor", `"worker-1:attempt-1"`})
	commitBase  = base("commit", member{"authorization_id", `"` + exampleAuthID + `"`}, member{"external_ref", `"re_1"`})
	cancelBase  = base("cancel", member{"authorization_id", `"` + exampleAuthID + `"`})
	reportBase  = base("report_unknown", member{"authorization_id", `"` + exampleAuthID + `"`})
	resolveBase = base("resolve", member{"authorization_id", `"` + exampleAuthID + `"`},
		member{"outcome", `"committed"`}, member{"external_ref", `"re_1"`})
	recordBase = base("record", member{"operation", `"price.lookup"`},
		member{"intent", `{"run_id":"run-7f3a","step":"2","action":"price.lookup"}`})
)

// with returns the body of ms with the given members replaced in place (or
// appended when new); a value of "-" drops the member.
func with(ms []member, kv ...string) []byte {
	out := append([]member(nil), ms...)
	for i := 0; i < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		found := false
		for j := range out {
			if out[j].k == k {
				out[j].v, found = v, true
			}
		}
		if !found {
			out = append(out, member{k, v})
		}
	}
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, m := range out {
		if m.v == "-" {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(`"` + m.k + `":` + m.v)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// plus appends a raw member without replacing anything: a duplicate.
func plus(body []byte, rawMember string) []byte {
	return append(append(bytes.TrimSuffix(body, []byte("}")), ","+rawMember...), '}')
}

func nested(depth int) string {
	return strings.Repeat("[", depth) + strings.Repeat("]", depth)
}

func repeatList(n int, elem string) string {
	return "[" + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]"
}

func recordKey(k string) []byte {
	switch k {
	case "":
		return []byte(goodKey)
	case noKey:
		return nil
	}
	return []byte(k)
}

// padTo pads a body with trailing spaces to exactly n bytes.
func padTo(body []byte, n int) []byte {
	return append(append([]byte(nil), body...), bytes.Repeat([]byte(" "), n-len(body))...)
}

// badInput is one record the decoder must refuse, with the exact reason and
// whom the rejection is answered to.
type badInput struct {
	name   string
	key    string // record key; "" means goodKey
	value  []byte
	lim    wire.Limits
	reason wire.Reason
	// answeredTo is the mandate key the rejection is answered to; ""
	// means it has none and goes to the dead-letter topic.
	answeredTo string
	detail     string // a substring of the detail, when it matters
}

// badInputs covers faults.md's bad-input catalogue, one case per class. The
// fuzz target is seeded from them too.
func badInputs() []badInput {
	valid := with(proposeBase)
	tenThousandTargets := repeatList(10_000, `"t"`)

	return []badInput{
		// Malformed JSON: the record key is the only identity left.
		{name: "a truncated body is malformed json answered to the record key", value: []byte(`{"amount":`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a truncated body without a record key is dead-lettered", key: noKey, value: []byte(`{"amount":`), reason: wire.ReasonMalformedJSON},
		{name: "a truncated body with a garbage record key is dead-lettered", key: "not a key", value: []byte(`{"amount":`), reason: wire.ReasonMalformedJSON},
		{name: "trailing garbage after the object is malformed json", value: append(append([]byte(nil), valid...), " x"...), reason: wire.ReasonMalformedJSON, answeredTo: goodKey, detail: "trailing data"},
		{name: "a second object after the first is malformed json", value: append(append([]byte(nil), valid...), valid...), reason: wire.ReasonMalformedJSON, answeredTo: goodKey, detail: "trailing data"},
		{name: "an array instead of an object is malformed json", value: []byte(`[` + string(valid) + `]`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey, detail: "not a JSON object"},
		{name: "a JSON string instead of an object is malformed json", value: []byte(`"propose"`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a JSON null instead of an object is malformed json", value: []byte(`null`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "an empty value is malformed json", value: []byte{}, reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a tombstone (nil value) is malformed json", value: nil, reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a whitespace-only value is malformed json", value: []byte(" \n\t "), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a byte-order mark before the object is malformed json", value: append([]byte("\xef\xbb\xbf"), valid...), reason: wire.ReasonMalformedJSON, answeredTo: goodKey, detail: "byte-order mark"},
		{name: "a byte-order mark after leading whitespace is malformed json", value: append([]byte(" \xef\xbb\xbf"), valid...), reason: wire.ReasonMalformedJSON, answeredTo: goodKey, detail: "byte-order mark"},
		{name: "NaN as an amount is not JSON at all", value: with(proposeBase, "amount", `{"minor_units":NaN,"currency":"EUR"}`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "Infinity as an amount is not JSON at all", value: with(proposeBase, "amount", `{"minor_units":Infinity,"currency":"EUR"}`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a leading zero is not JSON at all", value: with(proposeBase, "amount", `{"minor_units":0100,"currency":"EUR"}`), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a raw NUL byte inside a string is not JSON at all", value: with(revokeBase, "reason", "\"a\x00b\""), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},
		{name: "a raw tab inside a string is not JSON at all", value: with(revokeBase, "reason", "\"a\tb\""), reason: wire.ReasonMalformedJSON, answeredTo: goodKey},

		// Size: checked before any parsing.
		{name: "one byte over a configured limit is too large", value: padTo(valid, 1025), lim: wire.Limits{MaxRecordBytes: 1024}, reason: wire.ReasonTooLarge, answeredTo: goodKey, detail: "1025 bytes; the limit is 1024"},
		{name: "one byte over the default limit is too large", value: padTo(valid, wire.MaxRecordBytesDefault+1), reason: wire.ReasonTooLarge, answeredTo: goodKey},
		{name: "a 2 MB body is too large without a record key and dead-lettered", key: noKey, value: padTo(valid, 2<<20), reason: wire.ReasonTooLarge},
		{name: "an oversized body is refused for its size before its bytes are looked at", value: bytes.Repeat([]byte{0xff}, 2<<20), reason: wire.ReasonTooLarge, answeredTo: goodKey},
		{name: "a million-element array is too large before it is too complex", value: with(grantBase, "targets", repeatList(1_000_000, `"t"`)), reason: wire.ReasonTooLarge, answeredTo: goodKey},

		// Schema version: answered, never waited for.
		{name: "schema version 99 is unsupported", value: with(proposeBase, "v", `99`), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey},
		{name: "a missing schema version is unsupported", value: with(proposeBase, "v", "-"), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey, detail: "missing"},
		{name: "a schema version given as a string is unsupported", value: with(proposeBase, "v", `"1"`), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey},
		{name: "a schema version written 1.0 is unsupported", value: with(proposeBase, "v", `1.0`), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey},
		{name: "a null schema version is unsupported", value: with(proposeBase, "v", `null`), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey},
		{name: "an unsupported version without a record key is answered to the mandate the body names", key: noKey, value: with(proposeBase, "v", `2`), reason: wire.ReasonUnsupportedVersion, answeredTo: goodKey},
		{name: "an unsupported version with no identity anywhere is dead-lettered", key: noKey, value: []byte(`{"v":2,"anything":"else"}`), reason: wire.ReasonUnsupportedVersion},

		// Command type.
		{name: "an unknown command type is refused", value: with(proposeBase, "type", `"transfer"`), reason: wire.ReasonUnknownCommand, answeredTo: goodKey},
		{name: "command types are case sensitive", value: with(proposeBase, "type", `"Propose"`), reason: wire.ReasonUnknownCommand, answeredTo: goodKey},
		{name: "a numeric command type is invalid", value: with(proposeBase, "type", `5`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a missing command type is a missing field", value: with(proposeBase, "type", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:type"},
		{name: "a null command type is a missing field", value: with(proposeBase, "type", "null"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:type"},

		// Identity.
		{name: "no org and no mandate id is missing identity", value: with(proposeBase, "org", "-", "mandate_id", "-"), reason: wire.ReasonMissingIdentity, answeredTo: goodKey},
		{name: "no identity in the body nor the record key is dead-lettered", key: noKey, value: with(proposeBase, "org", "-", "mandate_id", "-"), reason: wire.ReasonMissingIdentity},
		{name: "a missing org is a missing field", value: with(proposeBase, "org", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:org"},
		{name: "a missing mandate id is a missing field", value: with(proposeBase, "mandate_id", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:mandate_id"},
		{name: "a null mandate id is outside the id grammar", value: with(proposeBase, "mandate_id", "null"), reason: wire.ReasonIDInvalid, answeredTo: goodKey},

		// Missing fields.
		{name: "a propose without an idempotency key is refused", value: with(proposeBase, "idempotency_key", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:idempotency_key"},
		{name: "a propose with a null idempotency key is refused", value: with(proposeBase, "idempotency_key", "null"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:idempotency_key"},
		{name: "a propose with an empty idempotency key is refused", value: with(proposeBase, "idempotency_key", `""`), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:idempotency_key"},
		{name: "a propose without an amount is refused", value: with(proposeBase, "amount", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:amount"},
		{name: "a propose with a null amount is refused", value: with(proposeBase, "amount", "null"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:amount"},
		{name: "an amount without minor units is refused", value: with(proposeBase, "amount", `{"currency":"EUR"}`), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:amount.minor_units"},
		{name: "an amount without a currency is refused", value: with(proposeBase, "amount", `{"minor_units":1}`), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:amount.currency"},
		{name: "a propose without an operation is refused", value: with(proposeBase, "operation", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:operation"},
		{name: "a propose without a target is refused", value: with(proposeBase, "target", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:target"},
		{name: "a begin without an authorization id is refused", value: with(beginBase, "authorization_id", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:authorization_id"},
		{name: "a commit without an external reference is refused", value: with(commitBase, "external_ref", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:external_ref"},
		{name: "a begin without an executor or idempotency key is refused naming executor", value: with(beginBase, "executor", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:executor"},
		{name: "a begin with an empty executor and no idempotency key is refused", value: with(beginBase, "executor", `""`), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:executor"},

		// The executor boundary's fields.
		{name: "an executor outside the id grammar is refused", value: with(beginBase, "executor", `"worker 1"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "an execution token of zero is refused", value: with(commitBase, "execution_token", `0`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey, detail: "execution_token"},
		{name: "a negative execution token is refused", value: with(cancelBase, "execution_token", `-1`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "an execution token in a string is refused", value: with(reportBase, "execution_token", `"1"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a fractional execution token is refused", value: with(resolveBase, "execution_token", `1.0`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "an execution token on a begin is an unknown field", value: with(beginBase, "execution_token", `1`), reason: wire.ReasonUnknownField, answeredTo: goodKey},
		{name: "a result that is not an object is refused", value: with(commitBase, "result", `["ok"]`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey, detail: "result must be a JSON object"},
		{name: "a result that is a string is refused", value: with(commitBase, "result", `"ok"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a result over 8 KiB is refused", value: with(commitBase, "result", `{"a":"`+strings.Repeat("x", 8200)+`"}`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey, detail: "the limit is 8192"},
		{name: "a result with an escape character (a terminal's control sequence) is refused", value: with(commitBase, "result", `{"a":"x\u001b[2Jy"}`), reason: wire.ReasonControlChar, answeredTo: goodKey},
		{name: "a result with a NUL is refused", value: with(commitBase, "result", `{"a":"x\u0000y"}`), reason: wire.ReasonNULByte, answeredTo: goodKey},
		{name: "a result key with a newline is refused", value: with(commitBase, "result", `{"a\nb":1}`), reason: wire.ReasonControlChar, answeredTo: goodKey},
		{name: "a newline outside the result is still refused", value: with(commitBase, "external_ref", `"re_1\nforged"`, "result", `{"a":"x\ny"}`), reason: wire.ReasonControlChar, answeredTo: goodKey},
		{name: "a newline in a result nested in another member is refused", value: with(commitBase, "meta", `{"result":{"a":"x\ny"}}`), reason: wire.ReasonControlChar, answeredTo: goodKey},
		{name: "a result with a duplicate key is refused", value: with(commitBase, "result", `{"a":1,"a":2}`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey},
		{name: "a result nested too deep is refused", value: with(commitBase, "result", `{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":1}}}}}}}}`), reason: wire.ReasonTooComplex, answeredTo: goodKey},
		{name: "a result on a cancel is an unknown field", value: with(cancelBase, "result", `{}`), reason: wire.ReasonUnknownField, answeredTo: goodKey},
		{name: "a resolve as committed without an external reference is refused", value: with(resolveBase, "external_ref", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:external_ref"},
		{name: "a resolve without an outcome is refused", value: with(resolveBase, "outcome", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:outcome"},
		{name: "a grant without uses is refused", value: with(grantBase, "uses", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:uses"},
		{name: "a grant without a max amount is refused", value: with(grantBase, "max_amount", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:max_amount"},
		{name: "a grant without operations is refused", value: with(grantBase, "operations", "-"), reason: wire.ReasonMissingField, answeredTo: goodKey, detail: "missing_field:operations"},

		// Unknown fields are refused, never ignored.
		{name: "an unknown top-level field is refused", value: with(proposeBase, "admin", `true`), reason: wire.ReasonUnknownField, answeredTo: goodKey, detail: `"admin"`},
		{name: "an unknown field inside an amount is refused", value: with(proposeBase, "amount", `{"minor_units":1,"currency":"EUR","scale":2}`), reason: wire.ReasonUnknownField, answeredTo: goodKey, detail: `"scale"`},
		{name: "another command's field is unknown to this one", value: with(proposeBase, "external_ref", `"re_1"`), reason: wire.ReasonUnknownField, answeredTo: goodKey},
		{name: "an upper-case spelling alone is an unknown field", value: with(proposeBase, "amount", "-", "AMOUNT", `{"minor_units":1,"currency":"EUR"}`), reason: wire.ReasonUnknownField, answeredTo: goodKey},

		// Invalid UTF-8 is refused before encoding/json can replace it.
		{name: "a raw 0xff byte is invalid utf-8", value: with(revokeBase, "reason", "\"a\xffb\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "an overlong encoding of slash is invalid utf-8", value: with(revokeBase, "reason", "\"a\xc0\xafb\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "an overlong encoding of NUL is invalid utf-8", value: with(revokeBase, "reason", "\"a\xc0\x80b\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "a surrogate encoded as raw bytes is invalid utf-8", value: with(revokeBase, "reason", "\"a\xed\xa0\x80b\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "invalid utf-8 in a mandate id is refused before the id grammar", value: with(proposeBase, "mandate_id", "\"m\xff\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "invalid utf-8 without a record key is dead-lettered", key: noKey, value: with(revokeBase, "reason", "\"\xff\""), reason: wire.ReasonInvalidUTF8},
		{name: "a lone high surrogate escape is invalid utf-8", value: with(revokeBase, "reason", `"a\ud800b"`), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "a lone low surrogate escape is invalid utf-8", value: with(revokeBase, "reason", `"\udc00"`), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "a reversed surrogate pair is invalid utf-8", value: with(revokeBase, "reason", `"\ude00\ud83d"`), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "a literal replacement character is refused like the replacement encoding/json makes", value: with(revokeBase, "reason", "\"\xef\xbf\xbd\""), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},
		{name: "a lone surrogate in a key is invalid utf-8", value: with(proposeBase, `\ud800`, `1`), reason: wire.ReasonInvalidUTF8, answeredTo: goodKey},

		// NUL and control characters.
		{name: "an escaped NUL is a nul byte", value: with(revokeBase, "reason", `"a\u0000b"`), reason: wire.ReasonNULByte, answeredTo: goodKey},
		{name: "an escaped NUL in a key is a nul byte", value: with(proposeBase, `a\u0000`, `1`), reason: wire.ReasonNULByte, answeredTo: goodKey},
		{name: "an escaped NUL in an idempotency key is a nul byte", value: with(proposeBase, "idempotency_key", `"k\u0000"`), reason: wire.ReasonNULByte, answeredTo: goodKey},
		{name: "an escaped bell is a control character", value: with(revokeBase, "reason", `"a\u0007b"`), reason: wire.ReasonControlChar, answeredTo: goodKey, detail: "U+0007"},
		{name: "an escaped newline is a control character", value: with(revokeBase, "reason", `"line 1\nline 2"`), reason: wire.ReasonControlChar, answeredTo: goodKey, detail: "U+000A"},
		{name: "DEL is a control character", value: with(revokeBase, "reason", `"\u007f"`), reason: wire.ReasonControlChar, answeredTo: goodKey, detail: "U+007F"},
		{name: "a C1 control character is a control character", value: with(revokeBase, "reason", `"\u0085"`), reason: wire.ReasonControlChar, answeredTo: goodKey, detail: "U+0085"},

		// Duplicate and case-variant keys: encoding/json would keep the last.
		{name: "a duplicate amount is ambiguous", value: plus(with(proposeBase), `"amount":{"minor_units":1000000,"currency":"EUR"}`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey, detail: `"amount" appears twice`},
		{name: "a case-variant amount is ambiguous", value: plus(with(proposeBase), `"Amount":{"minor_units":1000000,"currency":"EUR"}`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey, detail: "differ only in case"},
		{name: "a case-variant type is ambiguous", value: plus(with(proposeBase), `"Type":"grant"`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey},
		{name: "a duplicate org is ambiguous even when both agree", value: plus(with(proposeBase), `"org":"acme"`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey},
		{name: "duplicate minor units inside an amount are ambiguous", value: with(proposeBase, "amount", `{"minor_units":1,"minor_units":1000000,"currency":"EUR"}`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey},
		{name: "a duplicate key without a record key leaves no identity", key: noKey, value: plus(with(proposeBase), `"org":"evil"`), reason: wire.ReasonAmbiguousField},
		{name: "a listed operation twice is ambiguous", value: with(grantBase, "operations", `["payment.refund","payment.refund"]`), reason: wire.ReasonAmbiguousField, answeredTo: goodKey},

		// Complexity: bounded work per record.
		{name: "10 000 levels of nesting are too complex", value: with(proposeBase, "x", nested(10_000)), reason: wire.ReasonTooComplex, answeredTo: goodKey, detail: "deeper than 8"},
		{name: "10 000 levels of nesting without a record key are dead-lettered", key: noKey, value: []byte(`{"a":` + nested(10_000) + `}`), reason: wire.ReasonTooComplex},
		{name: "nine levels of nesting are too complex", value: with(proposeBase, "x", nested(8)), reason: wire.ReasonTooComplex, answeredTo: goodKey},
		{name: "eight levels of nesting parse and then fail as an unknown field", value: with(proposeBase, "x", nested(7)), reason: wire.ReasonUnknownField, answeredTo: goodKey},
		{name: "10 000 array elements are too complex", value: with(grantBase, "targets", tenThousandTargets), reason: wire.ReasonTooComplex, answeredTo: goodKey, detail: "more than 256 elements"},
		{name: "257 array elements are too complex", value: with(grantBase, "targets", repeatList(257, `"t"`)), reason: wire.ReasonTooComplex, answeredTo: goodKey},
		{name: "65 keys in one object are too complex", value: with(proposeBase, manyMembers(60)...), reason: wire.ReasonTooComplex, answeredTo: goodKey, detail: "more than 64 keys"},
		{name: "more than 4096 tokens are too complex", value: with(proposeBase, "x", repeatList(40, repeatList(120, "1"))), reason: wire.ReasonTooComplex, answeredTo: goodKey, detail: "4096 JSON tokens"},

		// Amounts: integer minor units in (0, MaxMinorUnits].
		{name: "a negative amount is invalid", value: amount(`-1`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a zero amount is invalid", value: amount(`0`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a negative zero amount is invalid", value: amount(`-0`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "an amount of 2^63 overflows", value: amount(`9223372036854775808`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey, detail: "overflows"},
		{name: "an amount of 1e309 is not an integer", value: amount(`1e309`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a fractional amount is invalid", value: amount(`1.5`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "an amount written 1.0 is invalid", value: amount(`1.0`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "an amount in a string is invalid", value: amount(`"100"`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "an amount in exponent notation is invalid", value: amount(`1e2`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "an amount one over the maximum is invalid", value: amount(`1000000000000001`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a boolean amount is invalid", value: amount(`true`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a bare number instead of a money object is invalid", value: with(proposeBase, "amount", `15000`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a null minor units is a missing field", value: amount(`null`), reason: wire.ReasonMissingField, answeredTo: goodKey},

		// Currencies: active upper-case ISO 4217 codes only.
		{name: "a lower-case currency is invalid", value: currency(`"usd"`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a currency that does not exist is invalid", value: currency(`"EUD"`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a numeric currency is invalid", value: currency(`5`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "an empty currency is invalid", value: currency(`""`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a null currency is invalid", value: currency(`null`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a precious metal is not a currency", value: currency(`"XAU"`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a currency with a trailing space is invalid", value: currency(`"EUR "`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},

		// Timestamps: RFC 3339 with a zone, years 2000 to 2199.
		{name: "a timestamp without a zone is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "month 13, day 40, hour 99 is invalid", value: with(proposeBase, "sent_at", `"2026-13-40T99:99"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a leap second is invalid", value: with(proposeBase, "sent_at", `"2016-12-31T23:59:60Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "epoch milliseconds are invalid", value: with(proposeBase, "sent_at", `1764489600000`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "epoch seconds in a string are invalid", value: with(proposeBase, "sent_at", `"1764489600"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a one-digit hour is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T8:00:00Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a comma before the fraction is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00,5Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "an offset of 24 hours is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00+24:00"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "an offset of 60 minutes is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00+00:60"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a lower-case zone letter is invalid", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "February 30 is invalid", value: with(proposeBase, "sent_at", `"2026-02-30T08:00:00Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a year before 2000 is invalid", value: with(proposeBase, "sent_at", `"1999-12-31T23:59:59Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a year after 2199 is invalid", value: with(proposeBase, "sent_at", `"2200-01-01T00:00:00Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a year 2000 that is 1999 in UTC is invalid", value: with(proposeBase, "sent_at", `"2000-01-01T00:30:00+01:00"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a year 2199 that is 2200 in UTC is invalid", value: with(proposeBase, "sent_at", `"2199-12-31T23:30:00-01:00"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "an invalid deadline is a deadline problem", value: with(proposeBase, "deadline", `"2026-11-30T08:00:00"`), reason: wire.ReasonDeadlineInvalid, answeredTo: goodKey},
		{name: "a deadline in epoch milliseconds is a deadline problem", value: with(proposeBase, "deadline", `1764489600000`), reason: wire.ReasonDeadlineInvalid, answeredTo: goodKey},
		{name: "an invalid sent_at on a propose stays a timestamp problem", value: with(proposeBase, "sent_at", `"tomorrow"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a grant valid until before it is valid from is invalid", value: with(grantBase, "valid_from", `"2026-12-01T00:00:00Z"`, "valid_until", `"2026-11-30T00:00:00Z"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},
		{name: "a grant valid until exactly when it is valid from is invalid", value: with(grantBase, "valid_from", `"2026-12-01T00:00:00Z"`, "valid_until", `"2026-12-01T01:00:00+01:00"`), reason: wire.ReasonTimestampInvalid, answeredTo: goodKey},

		// Ids outside the grammar.
		{name: "a zero-width space in a mandate id is outside the grammar", value: with(proposeBase, "mandate_id", `"refund-case\u200b1842"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a Cyrillic letter in an org is outside the grammar", value: with(proposeBase, "org", `"аcme"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "an upper-case org is outside the grammar", value: with(proposeBase, "org", `"Acme"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a slash in a mandate id is outside the grammar", value: with(proposeBase, "mandate_id", `"refund/1842"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a 200-character mandate id is outside the grammar", value: with(proposeBase, "mandate_id", `"`+strings.Repeat("m", 200)+`"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a SQL-injection-like mandate id is outside the grammar", value: with(proposeBase, "mandate_id", `"'); DROP TABLE x;--"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a SQL-injection-like idempotency key is outside the grammar", value: with(proposeBase, "idempotency_key", `"'); DROP TABLE x;--"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a SQL-injection-like target is outside the grammar", value: with(proposeBase, "target", `"'); DROP TABLE x;--"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a 129-character authorization id is outside the grammar", value: with(beginBase, "authorization_id", `"`+strings.Repeat("a", 129)+`"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a target outside the grammar in a grant is refused", value: with(grantBase, "targets", `["customer 77"]`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "an external reference with a space is invalid", value: with(commitBase, "external_ref", `"re 1"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "an upper-case operation is invalid", value: with(proposeBase, "operation", `"Payment.Refund"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},

		// Other field rules.
		{name: "zero uses are invalid", value: with(grantBase, "uses", `0`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "more than a million uses are invalid", value: with(grantBase, "uses", `1000001`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "an empty operations list is invalid", value: with(grantBase, "operations", `[]`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a hold window of zero seconds is invalid", value: with(grantBase, "hold_seconds", `0`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a hold window over a week is invalid", value: with(grantBase, "hold_seconds", `604801`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a release policy that is not a boolean is invalid", value: with(grantBase, "release_on_cancel", `"yes"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a total limit in another currency is invalid", value: with(grantBase, "total_limit", `{"minor_units":50000,"currency":"USD"}`), reason: wire.ReasonCurrencyInvalid, answeredTo: goodKey},
		{name: "a total limit below the per-use maximum is invalid", value: with(grantBase, "total_limit", `{"minor_units":19999,"currency":"EUR"}`), reason: wire.ReasonAmountInvalid, answeredTo: goodKey},
		{name: "a based-on version of zero is invalid", value: with(proposeBase, "based_on_version", `0`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a grant based on a negative version is invalid", value: with(grantBase, "based_on_version", `-1`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a grant based on a version given as a string is invalid", value: with(grantBase, "based_on_version", `"3"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a revoke based on a version is an unknown field", value: with(revokeBase, "based_on_version", `3`), reason: wire.ReasonUnknownField, answeredTo: goodKey},
		{name: "a resolve outcome other than committed or cancelled is invalid", value: with(resolveBase, "outcome", `"maybe"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a resolve's reconciler outside the id grammar is invalid", value: with(resolveBase, "reconciler", `"ops team"`), reason: wire.ReasonIDInvalid, answeredTo: goodKey},
		{name: "a resolve's result that is not an object is invalid", value: with(resolveBase, "result", `"ok"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a resolve as cancelled with a result is invalid (a result is a committed effect's)", value: with(resolveBase, "outcome", `"cancelled"`, "result", `{"a":1}`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},
		{name: "a reason longer than 512 bytes is invalid", value: with(revokeBase, "reason", `"`+strings.Repeat("é", 257)+`"`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey, detail: "514 bytes"},
		{name: "a string where an object is expected is invalid", value: with(proposeBase, "target", `{"id":"customer-77"}`), reason: wire.ReasonFieldInvalid, answeredTo: goodKey},

		// The record key decides the partition; the body must agree with it.
		{name: "a record without a key is answered to the mandate its body names", key: noKey, value: valid, reason: wire.ReasonMissingRecordKey, answeredTo: goodKey, detail: `produce with key "acme/refund-case-1842"`},
		{name: "a body naming another org is a key mismatch answered to the record key", value: with(proposeBase, "org", `"evil"`), reason: wire.ReasonKeyMismatch, answeredTo: goodKey},
		{name: "a body naming another mandate is a key mismatch answered to the record key", value: with(proposeBase, "mandate_id", `"other-mandate"`), reason: wire.ReasonKeyMismatch, answeredTo: goodKey},
		{name: "a record key naming another mandate is answered to that record key", key: "acme/other-mandate", value: valid, reason: wire.ReasonKeyMismatch, answeredTo: "acme/other-mandate"},
		{name: "a record key that is not a mandate key is a mismatch answered to the body's mandate", key: "garbage", value: valid, reason: wire.ReasonKeyMismatch, answeredTo: goodKey},
		{name: "a record key with a trailing newline is a mismatch", key: goodKey + "\n", value: valid, reason: wire.ReasonKeyMismatch, answeredTo: goodKey},
		{name: "a record key differing only in case is a mismatch", key: "ACME/refund-case-1842", value: valid, reason: wire.ReasonKeyMismatch, answeredTo: goodKey},
	}
}

// TestDecodeRejectsBadInput asserts the exact reason of every bad input, and
// whether a mandate key could be read (a rejected decision) or not (a dead
// letter).
func TestDecodeRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range badInputs() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, rej := wire.Decode(recordKey(tc.key), tc.value, tc.lim)
			require.Nil(t, cmd)
			require.NotNil(t, rej)
			require.Equal(t, tc.reason, rej.Reason, "detail: %s", rej.Detail)
			if tc.answeredTo == "" {
				require.Nil(t, rej.Key, "no mandate key can be read: the record must go to the dead-letter topic")
			} else {
				require.NotNil(t, rej.Key, "a mandate key can be read: the record must be answered with a decision")
				require.Equal(t, tc.answeredTo, rej.Key.String())
			}
			require.Contains(t, rej.Detail, tc.detail)
			require.Equal(t, string(rej.Reason)+": "+rej.Detail, rej.Error())
		})
	}
}

// distinctTargets is the longest targets list a grant may carry.
var distinctTargetIDs, distinctTargets = func() ([]string, string) {
	var ids, quoted []string
	for i := range wire.MaxTargets {
		id := "customer-" + strconv.Itoa(i)
		ids, quoted = append(ids, id), append(quoted, `"`+id+`"`)
	}
	return ids, "[" + strings.Join(quoted, ",") + "]"
}()

func amount(minorUnits string) []byte {
	return with(proposeBase, "amount", `{"minor_units":`+minorUnits+`,"currency":"EUR"}`)
}

func currency(code string) []byte {
	return with(proposeBase, "amount", `{"minor_units":15000,"currency":`+code+`}`)
}

// manyMembers returns n distinct extra members as with() arguments.
func manyMembers(n int) []string {
	var kv []string
	for i := range n {
		kv = append(kv, "x"+strings.Repeat("y", i), "1")
	}
	return kv
}

// TestDecodeSizeLimitIsInclusive puts a valid record exactly at the limit:
// the size check passes it, and one more byte is refused.
func TestDecodeSizeLimitIsInclusive(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1024, wire.MaxRecordBytesDefault} {
		lim := wire.Limits{}
		if limit != wire.MaxRecordBytesDefault {
			lim.MaxRecordBytes = limit
		}
		cmd, rej := wire.Decode([]byte(goodKey), padTo(with(proposeBase), limit), lim)
		require.Nil(t, rej, "exactly %d bytes must pass the size check", limit)
		require.Equal(t, wire.CmdPropose, cmd.Type)

		cmd, rej = wire.Decode([]byte(goodKey), padTo(with(proposeBase), limit+1), lim)
		require.Nil(t, cmd)
		require.Equal(t, wire.ReasonTooLarge, rej.Reason)
	}
}

// TestDecodeDeepNestingIsBounded shows the parser stops at the depth limit
// instead of walking the whole record: 10 000 levels cost about as many
// allocations as ten (walking them would cost at least one per level; the
// slack absorbs the odd background allocation AllocsPerRun also counts).
func TestDecodeDeepNestingIsBounded(t *testing.T) {
	shallow := with(proposeBase, "x", nested(10))
	deep := with(proposeBase, "x", nested(10_000))
	allocs := func(v []byte) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, rej := wire.Decode([]byte(goodKey), v, wire.Limits{}); rej == nil || rej.Reason != wire.ReasonTooComplex {
				panic("expected too_complex")
			}
		})
	}
	require.Less(t, allocs(deep), allocs(shallow)+50)
}

func BenchmarkDecodeDeepNesting(b *testing.B) {
	deep := with(proposeBase, "x", nested(10_000))
	for b.Loop() {
		wire.Decode([]byte(goodKey), deep, wire.Limits{})
	}
}

func BenchmarkDecodePropose(b *testing.B) {
	v := with(proposeBase)
	for b.Loop() {
		wire.Decode([]byte(goodKey), v, wire.Limits{})
	}
}

// TestDecodeRejectionCarriesWhatCouldBeRead checks the fields a rejected
// decision echoes: the command type, idempotency key and authorization id
// are carried only when they could be read and are valid.
func TestDecodeRejectionCarriesWhatCouldBeRead(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		value  []byte
		typ    wire.CommandType
		idem   string
		authID string
	}{
		{name: "a propose with a bad amount echoes its type and idempotency key", value: amount(`-1`), typ: wire.CmdPropose, idem: "intent-1"},
		{name: "a commit without an external reference echoes its authorization id", value: with(commitBase, "external_ref", "-"), typ: wire.CmdCommit, authID: exampleAuthID},
		{name: "an unknown command type is not echoed", value: with(proposeBase, "type", `"transfer"`), idem: "intent-1"},
		{name: "an idempotency key outside the grammar is not echoed", value: with(proposeBase, "idempotency_key", `"bad key"`), typ: wire.CmdPropose},
		{name: "an authorization id outside the grammar is not echoed", value: with(beginBase, "authorization_id", `"bad id"`), typ: wire.CmdBegin},
		{name: "malformed json echoes nothing", value: []byte(`{"type":"propose","idempotency_key":"intent-1"`)},
		{name: "a duplicate key echoes nothing", value: plus(with(proposeBase), `"type":"grant"`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, rej := wire.Decode([]byte(goodKey), tc.value, wire.Limits{})
			require.Nil(t, cmd)
			require.Equal(t, tc.typ, rej.Type)
			require.Equal(t, tc.idem, rej.IdempotencyKey)
			require.Equal(t, tc.authID, rej.AuthorizationID)
		})
	}
}

// TestDecodeAcceptsValidCommands decodes one command of every type to the
// exact struct, from the golden examples and from minimal bodies.
func TestDecodeAcceptsValidCommands(t *testing.T) {
	t.Parallel()
	key := partitioner.MandateKey{Org: "acme", MandateID: "refund-case-1842"}
	at := func(s string) time.Time {
		ts, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return ts.UTC()
	}
	example := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", "examples", name+".json"))
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		name  string
		value []byte
		want  *wire.Command
	}{
		{name: "the grant example decodes every field", value: example("grant"), want: &wire.Command{
			Type: wire.CmdGrant, Key: key, IdempotencyKey: "grant-case-1842-v1", SentAt: at("2026-11-30T08:00:00Z"),
			Grant: &wire.Grant{
				Uses: 1, MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"},
				TotalLimit: &wire.Money{MinorUnits: 20000, Currency: "EUR"},
				Operations: []string{"payment.refund"}, Targets: []string{"customer-77"},
				ValidFrom: at("2026-11-30T08:00:00Z"), ValidUntil: at("2026-12-07T08:00:00Z"),
				ReleaseOnCancel: true, HoldWindow: 5 * time.Minute, ExecutionTimeout: time.Hour,
				BasedOnVersion: 0, BindsVersion: true,
			}}},
		{name: "a grant based on a mandate version binds to it", value: with(grantBase, "based_on_version", `7`), want: &wire.Command{
			Type: wire.CmdGrant, Key: key,
			Grant: &wire.Grant{
				Uses: 1, MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
				ReleaseOnCancel: true, HoldWindow: wire.DefaultHoldWindow, ExecutionTimeout: wire.DefaultExecutionTimout,
				BasedOnVersion: 7, BindsVersion: true,
			}}},
		{name: "a minimal grant takes the defaults", value: with(grantBase), want: &wire.Command{
			Type: wire.CmdGrant, Key: key,
			Grant: &wire.Grant{
				Uses: 1, MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
				ReleaseOnCancel: true, HoldWindow: wire.DefaultHoldWindow, ExecutionTimeout: wire.DefaultExecutionTimout,
			}}},
		{name: "a grant with optional fields set to null takes the defaults", value: with(grantBase, "total_limit", "null", "targets", "null",
			"valid_from", "null", "valid_until", "null", "release_on_cancel", "null", "hold_seconds", "null", "execution_timeout_seconds", "null",
			"idempotency_key", "null", "sent_at", "null"), want: &wire.Command{
			Type: wire.CmdGrant, Key: key,
			Grant: &wire.Grant{
				Uses: 1, MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
				ReleaseOnCancel: true, HoldWindow: wire.DefaultHoldWindow, ExecutionTimeout: wire.DefaultExecutionTimout,
			}}},
		{name: "a grant at the upper bounds decodes", value: with(grantBase, "uses", `1000000`,
			"max_amount", `{"minor_units":1000000000000000,"currency":"JPY"}`, "hold_seconds", `604800`,
			"execution_timeout_seconds", `604800`, "release_on_cancel", `false`, "targets", distinctTargets), want: &wire.Command{
			Type: wire.CmdGrant, Key: key,
			Grant: &wire.Grant{
				Uses: 1_000_000, MaxAmount: wire.Money{MinorUnits: wire.MaxMinorUnits, Currency: "JPY"}, Operations: []string{"payment.refund"},
				Targets: distinctTargetIDs, ReleaseOnCancel: false, HoldWindow: wire.MaxHoldWindow, ExecutionTimeout: wire.MaxExecutionTimeout,
			}}},
		{name: "the revoke example decodes", value: example("revoke"), want: &wire.Command{
			Type: wire.CmdRevoke, Key: key, IdempotencyKey: "revoke-case-1842", SentAt: at("2026-12-01T09:30:00Z"),
			Revoke: &wire.Revoke{Reason: "case 1842 closed by the customer"}}},
		{name: "a revoke reason is kept byte-exact, SQL-looking or not", value: with(revokeBase, "reason", `"'); DROP TABLE decisions;-- $1 %s \\ ☃ \ud83d\ude00"`), want: &wire.Command{
			Type: wire.CmdRevoke, Key: key, Revoke: &wire.Revoke{Reason: `'); DROP TABLE decisions;-- $1 %s \ ☃ 😀`}}},
		{name: "the propose example decodes every field", value: example("propose"), want: &wire.Command{
			Type: wire.CmdPropose, Key: key, IdempotencyKey: "refund-1842-attempt-intent", SentAt: at("2026-11-30T08:05:00.25Z"),
			Propose: &wire.Propose{Operation: "payment.refund", Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"},
				Target: "customer-77", BasedOnVersion: 1, Deadline: at("2026-11-30T08:09:00Z"),
				Intent: &wire.Intent{RunID: "run-5521", Step: "refund", Action: "payment.refund:customer-77"}}}},
		{name: "a fork decodes its intent and the authorization it supersedes", value: with(proposeBase,
			"intent", `{"action":"a.1","run_id":"run-1","step":"s:2"}`, "fork_of", `"au_x"`), want: &wire.Command{
			Type: wire.CmdPropose, Key: key, IdempotencyKey: "intent-1",
			Propose: &wire.Propose{Operation: "payment.refund", Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"},
				Target: "customer-77", Intent: &wire.Intent{RunID: "run-1", Step: "s:2", Action: "a.1"}, ForkOf: "au_x"}}},
		{name: "a propose at the maximum amount with an offset deadline decodes in UTC", value: with(proposeBase,
			"amount", `{"minor_units":1000000000000000,"currency":"EUR"}`, "deadline", `"2026-11-30T09:09:00.123456789+01:00"`), want: &wire.Command{
			Type: wire.CmdPropose, Key: key, IdempotencyKey: "intent-1",
			Propose: &wire.Propose{Operation: "payment.refund", Amount: wire.Money{MinorUnits: wire.MaxMinorUnits, Currency: "EUR"},
				Target: "customer-77", Deadline: time.Date(2026, 11, 30, 8, 9, 0, 123456789, time.UTC)}}},
		{name: "the begin example decodes", value: example("begin"), want: &wire.Command{
			Type: wire.CmdBegin, Key: key, Begin: &wire.Begin{AuthorizationID: exampleAuthID, Executor: "refund-worker-7:attempt-1"}}},
		{name: "a begin without an executor takes its idempotency key as the executor (v1, deprecated)", value: with(beginBase, "executor", "-", "idempotency_key", `"resume-1"`), want: &wire.Command{
			Type: wire.CmdBegin, Key: key, IdempotencyKey: "resume-1", Begin: &wire.Begin{AuthorizationID: exampleAuthID, Executor: "resume-1"}}},
		{name: "a begin with both keeps the executor apart from the idempotency key", value: with(beginBase, "idempotency_key", `"intent-1"`), want: &wire.Command{
			Type: wire.CmdBegin, Key: key, IdempotencyKey: "intent-1", Begin: &wire.Begin{AuthorizationID: exampleAuthID, Executor: "worker-1:attempt-1"}}},
		{name: "the commit example decodes with its token and its result re-encoded compactly with sorted keys", value: example("commit"), want: &wire.Command{
			Type: wire.CmdCommit, Key: key, Commit: &wire.Commit{AuthorizationID: exampleAuthID, ExternalRef: "re_3PqX9a2eZvKYlo2C1xQ", ExecutionToken: 1,
				Result: []byte(`{"amount":15000,"currency":"eur","id":"re_3PqX9a2eZvKYlo2C1xQ","status":"succeeded"}`)}}},
		{name: "a commit without a token or a result decodes (straight from reserved)", value: with(commitBase), want: &wire.Command{
			Type: wire.CmdCommit, Key: key, Commit: &wire.Commit{AuthorizationID: exampleAuthID, ExternalRef: "re_1"}}},
		{name: "a result keeps numbers as written and nested values", value: with(commitBase, "result", `{"z":[1.50,true,null],"a":{"n":-0.5e3}}`, "execution_token", `4611686018427387904`), want: &wire.Command{
			Type: wire.CmdCommit, Key: key, Commit: &wire.Commit{AuthorizationID: exampleAuthID, ExternalRef: "re_1", ExecutionToken: wire.MaxExecutionToken,
				Result: []byte(`{"a":{"n":-0.5e3},"z":[1.50,true,null]}`)}}},
		{name: "a result's text may hold newlines, tabs and carriage returns (a provider's multi-line answer), re-encoded escaped", value: with(commitBase, "result", `{"address":"1 Main St\nFlat 2\r\n\tLondon"}`), want: &wire.Command{
			Type: wire.CmdCommit, Key: key, Commit: &wire.Commit{AuthorizationID: exampleAuthID, ExternalRef: "re_1",
				Result: []byte(`{"address":"1 Main St\nFlat 2\r\n\tLondon"}`)}}},
		{name: "a resolve's result may hold a newline too", value: with(resolveBase, "result", `{"note":"a\nb"}`), want: &wire.Command{
			Type: wire.CmdResolve, Key: key, Resolve: &wire.Resolve{AuthorizationID: exampleAuthID, Outcome: wire.ResolveCommitted,
				ExternalRef: "re_1", Result: []byte(`{"note":"a\nb"}`)}}},
		{name: "the cancel example decodes", value: example("cancel"), want: &wire.Command{
			Type: wire.CmdCancel, Key: key, Cancel: &wire.Cancel{AuthorizationID: exampleAuthID,
				Reason:           "the customer withdrew the refund request",
				NotExecutedProof: "provider returned 404 for idempotency key refund-1842-attempt-intent", ExecutionToken: 1}}},
		{name: "the report_unknown example decodes", value: example("report_unknown"), want: &wire.Command{
			Type: wire.CmdReportUnknown, Key: key, Report: &wire.ReportUnknown{AuthorizationID: exampleAuthID,
				Detail: "provider timed out after 30 s; the refund may or may not have been made", ExecutionToken: 1}}},
		{name: "the resolve example decodes", value: example("resolve"), want: &wire.Command{
			Type: wire.CmdResolve, Key: key, Resolve: &wire.Resolve{AuthorizationID: exampleAuthID, Outcome: wire.ResolveCommitted,
				ExternalRef: "re_3PqX9a2eZvKYlo2C1xQ",
				Evidence:    "provider lists refund re_3PqX9a2eZvKYlo2C1xQ for customer-77, 150.00 EUR", ExecutionToken: 1}}},
		{name: "a resolve as cancelled needs no external reference", value: with(resolveBase, "outcome", `"cancelled"`, "external_ref", "-"), want: &wire.Command{
			Type: wire.CmdResolve, Key: key, Resolve: &wire.Resolve{AuthorizationID: exampleAuthID, Outcome: wire.ResolveCancelled}}},
		{name: "a resolve as committed carries the provider's result, re-encoded compactly with sorted keys", value: with(resolveBase, "result", `{ "z": 1, "a": "re_1" }`), want: &wire.Command{
			Type: wire.CmdResolve, Key: key, Resolve: &wire.Resolve{AuthorizationID: exampleAuthID, Outcome: wire.ResolveCommitted,
				ExternalRef: "re_1", Result: []byte(`{"a":"re_1","z":1}`)}}},
		{name: "a resolve names its reconciler", value: with(resolveBase, "reconciler", `"console:ot_abc"`), want: &wire.Command{
			Type: wire.CmdResolve, Key: key, Resolve: &wire.Resolve{AuthorizationID: exampleAuthID, Outcome: wire.ResolveCommitted,
				ExternalRef: "re_1", Reconciler: "console:ot_abc"}}},
		{name: "leading and trailing whitespace around the object is fine", value: []byte(" \n" + string(with(beginBase)) + "\r\n\t "), want: &wire.Command{
			Type: wire.CmdBegin, Key: key, Begin: &wire.Begin{AuthorizationID: exampleAuthID, Executor: "worker-1:attempt-1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd, rej := wire.Decode([]byte(goodKey), tc.value, wire.Limits{})
			require.Nil(t, rej)
			require.Equal(t, tc.want, cmd)
			require.Equal(t, tc.want.Type, cmd.Type)
		})
	}
}

func TestCommandAccessors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		cmd     wire.Command
		authID  string
		grantor bool
	}{
		{name: "a grant addresses no authorization and is a grantor command", cmd: wire.Command{Type: wire.CmdGrant, Grant: &wire.Grant{}}, grantor: true},
		{name: "a revoke is a grantor command", cmd: wire.Command{Type: wire.CmdRevoke, Revoke: &wire.Revoke{}}, grantor: true},
		{name: "a propose addresses no authorization", cmd: wire.Command{Type: wire.CmdPropose, Propose: &wire.Propose{}}},
		{name: "a begin addresses its authorization", cmd: wire.Command{Type: wire.CmdBegin, Begin: &wire.Begin{AuthorizationID: "a1"}}, authID: "a1"},
		{name: "a commit addresses its authorization", cmd: wire.Command{Type: wire.CmdCommit, Commit: &wire.Commit{AuthorizationID: "a2"}}, authID: "a2"},
		{name: "a cancel addresses its authorization", cmd: wire.Command{Type: wire.CmdCancel, Cancel: &wire.Cancel{AuthorizationID: "a3"}}, authID: "a3"},
		{name: "a report addresses its authorization", cmd: wire.Command{Type: wire.CmdReportUnknown, Report: &wire.ReportUnknown{AuthorizationID: "a4"}}, authID: "a4"},
		{name: "a resolve addresses its authorization and is a control-plane command", cmd: wire.Command{Type: wire.CmdResolve, Resolve: &wire.Resolve{AuthorizationID: "a5"}}, authID: "a5", grantor: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.authID, tc.cmd.AuthorizationID())
			require.Equal(t, tc.grantor, tc.cmd.Type.IsGrantorCommand())
			require.True(t, tc.cmd.Type.Known())
		})
	}
	require.False(t, wire.CommandType("transfer").Known())
	require.False(t, wire.CommandType("").Known())
}

func TestValidCurrency(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"EUR", "USD", "JPY", "CHF", "XCG", "ZWG"} {
		require.True(t, wire.ValidCurrency(c), c)
	}
	for _, c := range []string{"", "eur", "Eur", "EUD", "XAU", "XXX", "EURO", "€"} {
		require.False(t, wire.ValidCurrency(c), c)
	}
}
