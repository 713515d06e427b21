package wire_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

var update = flag.Bool("update", false, "rewrite testdata/examples/decision.json from the lifecycle")

var commandTypes = []string{"grant", "revoke", "propose", "begin", "commit", "cancel", "report_unknown", "resolve", "record"}

// compiledSchemas compiles every embedded schema once, with format
// assertions on (2020-12 only annotates formats by default).
var compiledSchemas = sync.OnceValues(func() (map[string]*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	entries, err := fs.ReadDir(wire.Schemas, "schema")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		b, err := wire.Schemas.ReadFile("schema/" + e.Name())
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		if err := c.AddResource(wire.SchemaBaseURL+e.Name(), doc); err != nil {
			return nil, err
		}
		names = append(names, e.Name())
	}
	out := map[string]*jsonschema.Schema{}
	for _, n := range names {
		s, err := c.Compile(wire.SchemaBaseURL + n)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(n, ".schema.json")] = s
	}
	return out, nil
})

func schemaFor(t testing.TB, name string) *jsonschema.Schema {
	t.Helper()
	all, err := compiledSchemas()
	require.NoError(t, err)
	s, ok := all[name]
	require.True(t, ok, "no schema %q", name)
	return s
}

// validate validates raw JSON against a schema; it reports an error for
// JSON the validator cannot parse too.
func validate(t testing.TB, name string, raw []byte) error {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	return schemaFor(t, name).Validate(doc)
}

func TestSchemasAreEmbeddedWithTheirIDs(t *testing.T) {
	t.Parallel()
	want := append(slices.Clone(commandTypes), "command", "decision", "defs")
	entries, err := fs.ReadDir(wire.Schemas, "schema")
	require.NoError(t, err)
	var got []string
	for _, e := range entries {
		b, err := wire.Schemas.ReadFile("schema/" + e.Name())
		require.NoError(t, err)
		var doc struct {
			Schema string `json:"$schema"`
			ID     string `json:"$id"`
		}
		require.NoError(t, json.Unmarshal(b, &doc))
		require.Equal(t, "https://json-schema.org/draft/2020-12/schema", doc.Schema, e.Name())
		require.Equal(t, wire.SchemaBaseURL+e.Name(), doc.ID)
		got = append(got, strings.TrimSuffix(e.Name(), ".schema.json"))
	}
	require.ElementsMatch(t, want, got)
	for _, name := range want {
		schemaFor(t, name) // compiles
	}
}

func readExample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "examples", name+".json"))
	require.NoError(t, err)
	return b
}

// TestExamplesAreValidForSchemaAndDecoder: every golden example passes its
// own schema, the any-command schema, and the decoder, as the right type.
func TestExamplesAreValidForSchemaAndDecoder(t *testing.T) {
	t.Parallel()
	for _, typ := range commandTypes {
		t.Run(typ, func(t *testing.T) {
			t.Parallel()
			raw := readExample(t, typ)
			require.NoError(t, validate(t, typ, raw))
			require.NoError(t, validate(t, "command", raw))
			for _, other := range commandTypes {
				if other != typ {
					require.Error(t, validate(t, other, raw), "the %s example must not pass the %s schema", typ, other)
				}
			}
			cmd, rej := wire.Decode([]byte(goodKey), raw, wire.Limits{})
			require.Nil(t, rej)
			require.Equal(t, wire.CommandType(typ), cmd.Type)
		})
	}
}

// TestEdgeCasesAreValidForSchemaAndDecoder: bodies at the edges of the
// contract that both must accept.
func TestEdgeCasesAreValidForSchemaAndDecoder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		value []byte
	}{
		{name: "a grant with every optional field null", value: with(grantBase, "total_limit", "null", "targets", "null",
			"valid_from", "null", "valid_until", "null", "release_on_cancel", "null", "hold_seconds", "null",
			"execution_timeout_seconds", "null", "idempotency_key", "null", "sent_at", "null")},
		{name: "a grant at every upper bound", value: with(grantBase, "uses", `1000000`, "targets", distinctTargets,
			"max_amount", `{"minor_units":1000000000000000,"currency":"JPY"}`,
			"total_limit", `{"minor_units":1000000000000000,"currency":"JPY"}`,
			"hold_seconds", `604800`, "execution_timeout_seconds", `604800`,
			"operations", repeatOperations(wire.MaxOperations))},
		{name: "a grant with an empty targets list", value: with(grantBase, "targets", `[]`)},
		{name: "a signed revoke", value: with(revokeBase, "signature",
			`{"key_id":"treasury-2026-11","alg":"ed25519","sig":"`+strings.Repeat("A", 86)+`=="}`)},
		{name: "a begin with an empty idempotency key", value: with(beginBase, "idempotency_key", `""`)},
		{name: "a begin naming its executor only by idempotency key (v1, deprecated)", value: with(beginBase, "executor", "-", "idempotency_key", `"resume-1"`)},
		{name: "a commit with the largest token and an 8 KiB result", value: with(commitBase, "execution_token", `4611686018427387904`,
			"result", `{"a":"`+strings.Repeat("x", 8192-8)+`"}`)},
		{name: "a commit with an empty result object", value: with(commitBase, "result", `{}`)},
		{name: "a resolve as cancelled with an empty external reference", value: with(resolveBase, "outcome", `"cancelled"`, "external_ref", `""`)},
		{name: "a resolve as committed with the provider's result", value: with(resolveBase, "result", `{"refund":"re_1","status":"succeeded"}`)},
		{name: "a resolve naming its reconciler", value: with(resolveBase, "reconciler", `"mandatectl:alice"`)},
		{name: "a record look-up (no result, no target)", value: with(recordBase)},
		{name: "a record with a target, an 8 KiB result, a key and a null sent_at", value: with(recordBase, "target", `"q:0a1b"`,
			"result", `{"a":"`+strings.Repeat("x", 8192-8)+`"}`, "idempotency_key", `"read-1"`, "sent_at", "null")},
		{name: "a propose with a nine-digit fraction and an offset", value: with(proposeBase, "sent_at", `"2199-12-31T23:59:59.999999999+23:59"`)},
		{name: "a propose with the largest based-on version", value: with(proposeBase, "based_on_version", `4611686018427387904`)},
		{name: "a propose forking an authorization of its intent", value: with(proposeBase,
			"intent", `{"run_id":"run-1","step":"s.2","action":"refund:c-7"}`, "fork_of", `"au_x"`)},
		{name: "a propose with a null intent and a null fork", value: with(proposeBase, "intent", "null", "fork_of", "null")},
		{name: "a revoke with a 512-byte reason of emoji and escapes", value: with(revokeBase, "reason", `"`+strings.Repeat("😀", 127)+`\"\\\/"`)},
		{name: "ids at their longest", value: with(proposeBase, "org", `"`+strings.Repeat("o", 63)+`"`,
			"mandate_id", `"`+strings.Repeat("M", 128)+`"`, "idempotency_key", `"0._:-`+strings.Repeat("k", 123)+`"`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, validate(t, "command", tc.value))
			var body struct {
				Org       string `json:"org"`
				MandateID string `json:"mandate_id"`
			}
			require.NoError(t, json.Unmarshal(tc.value, &body))
			cmd, rej := wire.Decode([]byte(body.Org+"/"+body.MandateID), tc.value, wire.Limits{})
			require.Nil(t, rej)
			require.NotNil(t, cmd)
		})
	}
}

func repeatOperations(n int) string {
	var ops []string
	for i := range n {
		ops = append(ops, `"op.`+strconv.Itoa(i)+`"`)
	}
	return "[" + strings.Join(ops, ",") + "]"
}

// TestInvalidCommandsFailSchemaAndDecoder: what the schemas can express, they
// refuse exactly as the decoder does.
func TestInvalidCommandsFailSchemaAndDecoder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		schema string
		value  []byte
		reason wire.Reason
	}{
		{name: "an unknown top-level field", schema: "propose", value: with(proposeBase, "admin", `true`), reason: wire.ReasonUnknownField},
		{name: "an unknown field inside an amount", schema: "propose", value: with(proposeBase, "amount", `{"minor_units":1,"currency":"EUR","scale":2}`), reason: wire.ReasonUnknownField},
		{name: "schema version 99", schema: "propose", value: with(proposeBase, "v", `99`), reason: wire.ReasonUnsupportedVersion},
		{name: "a schema version given as a string", schema: "propose", value: with(proposeBase, "v", `"1"`), reason: wire.ReasonUnsupportedVersion},
		{name: "a missing schema version", schema: "propose", value: with(proposeBase, "v", "-"), reason: wire.ReasonUnsupportedVersion},
		{name: "an unknown command type", schema: "command", value: with(proposeBase, "type", `"transfer"`), reason: wire.ReasonUnknownCommand},
		{name: "a propose without an idempotency key", schema: "propose", value: with(proposeBase, "idempotency_key", "-"), reason: wire.ReasonMissingField},
		{name: "a propose with an empty idempotency key", schema: "propose", value: with(proposeBase, "idempotency_key", `""`), reason: wire.ReasonMissingField},
		{name: "a propose without an amount", schema: "propose", value: with(proposeBase, "amount", "-"), reason: wire.ReasonMissingField},
		{name: "a propose with a null target", schema: "propose", value: with(proposeBase, "target", "null"), reason: wire.ReasonMissingField},
		{name: "a negative amount", schema: "propose", value: amount(`-1`), reason: wire.ReasonAmountInvalid},
		{name: "a zero amount", schema: "propose", value: amount(`0`), reason: wire.ReasonAmountInvalid},
		{name: "a fractional amount", schema: "propose", value: amount(`1.5`), reason: wire.ReasonAmountInvalid},
		{name: "an amount in a string", schema: "propose", value: amount(`"100"`), reason: wire.ReasonAmountInvalid},
		{name: "an amount over the maximum", schema: "propose", value: amount(`1000000000000001`), reason: wire.ReasonAmountInvalid},
		{name: "an amount of 2^63", schema: "propose", value: amount(`9223372036854775808`), reason: wire.ReasonAmountInvalid},
		{name: "a lower-case currency", schema: "propose", value: currency(`"usd"`), reason: wire.ReasonCurrencyInvalid},
		{name: "a currency that does not exist", schema: "propose", value: currency(`"EUD"`), reason: wire.ReasonCurrencyInvalid},
		{name: "a numeric currency", schema: "propose", value: currency(`5`), reason: wire.ReasonCurrencyInvalid},
		{name: "a timestamp without a zone", schema: "propose", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00"`), reason: wire.ReasonTimestampInvalid},
		{name: "a leap second", schema: "propose", value: with(proposeBase, "sent_at", `"2016-12-31T23:59:60Z"`), reason: wire.ReasonTimestampInvalid},
		{name: "a one-digit hour", schema: "propose", value: with(proposeBase, "sent_at", `"2026-11-30T8:00:00Z"`), reason: wire.ReasonTimestampInvalid},
		{name: "an offset of 24 hours", schema: "propose", value: with(proposeBase, "sent_at", `"2026-11-30T08:00:00+24:00"`), reason: wire.ReasonTimestampInvalid},
		{name: "February 30", schema: "propose", value: with(proposeBase, "sent_at", `"2026-02-30T08:00:00Z"`), reason: wire.ReasonTimestampInvalid},
		{name: "epoch milliseconds", schema: "propose", value: with(proposeBase, "deadline", `1764489600000`), reason: wire.ReasonDeadlineInvalid},
		{name: "a year before 2000", schema: "grant", value: with(grantBase, "valid_from", `"1999-12-31T23:59:59Z"`), reason: wire.ReasonTimestampInvalid},
		{name: "a slash in a mandate id", schema: "propose", value: with(proposeBase, "mandate_id", `"refund/1842"`), reason: wire.ReasonIDInvalid},
		{name: "a Cyrillic org", schema: "propose", value: with(proposeBase, "org", `"аcme"`), reason: wire.ReasonIDInvalid},
		{name: "a zero-width space in a target", schema: "propose", value: with(proposeBase, "target", `"customer\u200b77"`), reason: wire.ReasonIDInvalid},
		{name: "a 200-character authorization id", schema: "begin", value: with(beginBase, "authorization_id", `"`+strings.Repeat("a", 200)+`"`), reason: wire.ReasonIDInvalid},
		{name: "an escaped NUL in a reason", schema: "revoke", value: with(revokeBase, "reason", `"a\u0000b"`), reason: wire.ReasonNULByte},
		{name: "an escaped newline in a reason", schema: "revoke", value: with(revokeBase, "reason", `"a\nb"`), reason: wire.ReasonControlChar},
		{name: "a lone surrogate in a reason", schema: "revoke", value: with(revokeBase, "reason", `"\ud800"`), reason: wire.ReasonInvalidUTF8},
		{name: "a 513-byte ASCII reason", schema: "revoke", value: with(revokeBase, "reason", `"`+strings.Repeat("r", 513)+`"`), reason: wire.ReasonFieldInvalid},
		{name: "a resolve as committed without an external reference", schema: "resolve", value: with(resolveBase, "external_ref", "-"), reason: wire.ReasonMissingField},
		{name: "a resolve as committed with an empty external reference", schema: "resolve", value: with(resolveBase, "external_ref", `""`), reason: wire.ReasonMissingField},
		{name: "a resolve outcome of maybe", schema: "resolve", value: with(resolveBase, "outcome", `"maybe"`), reason: wire.ReasonFieldInvalid},
		{name: "a resolve as cancelled with a result", schema: "resolve", value: with(resolveBase, "outcome", `"cancelled"`, "result", `{"a":1}`), reason: wire.ReasonFieldInvalid},
		{name: "a resolve's result that is an array", schema: "resolve", value: with(resolveBase, "result", `[1]`), reason: wire.ReasonFieldInvalid},
		{name: "a resolve's reconciler with a space", schema: "resolve", value: with(resolveBase, "reconciler", `"ops team"`), reason: wire.ReasonIDInvalid},
		{name: "a commit external reference with a space", schema: "commit", value: with(commitBase, "external_ref", `"re 1"`), reason: wire.ReasonFieldInvalid},
		{name: "zero uses", schema: "grant", value: with(grantBase, "uses", `0`), reason: wire.ReasonFieldInvalid},
		{name: "an empty operations list", schema: "grant", value: with(grantBase, "operations", `[]`), reason: wire.ReasonFieldInvalid},
		{name: "an operation listed twice", schema: "grant", value: with(grantBase, "operations", `["a.b","a.b"]`), reason: wire.ReasonAmbiguousField},
		{name: "a hold window over a week", schema: "grant", value: with(grantBase, "hold_seconds", `604801`), reason: wire.ReasonFieldInvalid},
		{name: "a release policy that is a string", schema: "grant", value: with(grantBase, "release_on_cancel", `"yes"`), reason: wire.ReasonFieldInvalid},
		{name: "257 targets", schema: "grant", value: with(grantBase, "targets", repeatList(257, `"t"`)), reason: wire.ReasonTooComplex},
		{name: "a based-on version of zero", schema: "propose", value: with(proposeBase, "based_on_version", `0`), reason: wire.ReasonFieldInvalid},
		{name: "a begin without an authorization id", schema: "begin", value: with(beginBase, "authorization_id", "-"), reason: wire.ReasonMissingField},
		{name: "a begin without an executor or idempotency key", schema: "begin", value: with(beginBase, "executor", "-"), reason: wire.ReasonMissingField},
		{name: "an execution token of zero", schema: "commit", value: with(commitBase, "execution_token", `0`), reason: wire.ReasonFieldInvalid},
		{name: "an execution token over 2^62", schema: "cancel", value: with(cancelBase, "execution_token", `4611686018427387905`), reason: wire.ReasonFieldInvalid},
		{name: "a result that is an array", schema: "commit", value: with(commitBase, "result", `[1]`), reason: wire.ReasonFieldInvalid},
		{name: "a grantor field on a propose", schema: "propose", value: with(proposeBase, "uses", `1`), reason: wire.ReasonUnknownField},
		{name: "a case-variant key", schema: "propose", value: plus(with(proposeBase), `"Type":"grant"`), reason: wire.ReasonAmbiguousField},
		{name: "a null org", schema: "propose", value: with(proposeBase, "org", "null"), reason: wire.ReasonIDInvalid},
		{name: "a fork without an intent", schema: "propose", value: with(proposeBase, "fork_of", `"au_x"`), reason: wire.ReasonMissingField},
		{name: "a fork with a null intent", schema: "propose", value: with(proposeBase, "intent", "null", "fork_of", `"au_x"`), reason: wire.ReasonMissingField},
		{name: "an intent without its step", schema: "propose", value: with(proposeBase, "intent", `{"run_id":"r","action":"a"}`), reason: wire.ReasonMissingField},
		{name: "an unknown field in an intent", schema: "propose", value: with(proposeBase, "intent", `{"run_id":"r","step":"s","action":"a","key":"k"}`), reason: wire.ReasonUnknownField},
		{name: "an intent run id outside the id grammar", schema: "propose", value: with(proposeBase, "intent", `{"run_id":"r/1","step":"s","action":"a"}`), reason: wire.ReasonIDInvalid},
		{name: "an intent that is a string", schema: "propose", value: with(proposeBase, "intent", `"run-1/s/a"`), reason: wire.ReasonFieldInvalid},
		{name: "a record without an intent", schema: "record", value: with(recordBase, "intent", "-"), reason: wire.ReasonMissingField},
		{name: "a record with a null intent", schema: "record", value: with(recordBase, "intent", "null"), reason: wire.ReasonMissingField},
		{name: "a record without an operation", schema: "record", value: with(recordBase, "operation", "-"), reason: wire.ReasonMissingField},
		{name: "a record whose result is an array", schema: "record", value: with(recordBase, "result", `[1]`), reason: wire.ReasonFieldInvalid},
		{name: "a record with an amount", schema: "record", value: with(recordBase, "amount", `{"minor_units":1,"currency":"EUR"}`), reason: wire.ReasonUnknownField},
		{name: "a record naming an authorization", schema: "record", value: with(recordBase, "authorization_id", `"au_x"`), reason: wire.ReasonUnknownField},
		{name: "a record with a target outside the id grammar", schema: "record", value: with(recordBase, "target", `"what is the price?"`), reason: wire.ReasonIDInvalid},
		{name: "a fork of an id outside the id grammar", schema: "propose", value: with(proposeBase, "intent", `{"run_id":"r","step":"s","action":"a"}`, "fork_of", `"au x"`), reason: wire.ReasonIDInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Error(t, validate(t, tc.schema, tc.value), "the %s schema must refuse it", tc.schema)
			require.Error(t, validate(t, "command", tc.value), "the command schema must refuse it")
			cmd, rej := wire.Decode([]byte(goodKey), tc.value, wire.Limits{})
			require.Nil(t, cmd)
			require.Equal(t, tc.reason, rej.Reason, rej.Detail)
		})
	}
}

// TestSchemaGapsAreKnown lists what the decoder refuses but JSON Schema
// cannot express, so that a consumer validating with the schemas knows
// what else Decode will say. If one of these starts failing the schema,
// the schema got stricter: move the case to the test above.
func TestSchemaGapsAreKnown(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		key    string
		value  []byte
		reason wire.Reason
	}{
		{name: "a duplicate key", value: plus(with(proposeBase), `"amount":{"minor_units":1000000,"currency":"EUR"}`), reason: wire.ReasonAmbiguousField},
		{name: "an amount in exponent notation", value: amount(`1e2`), reason: wire.ReasonAmountInvalid},
		{name: "an amount written 1.0", value: amount(`1.0`), reason: wire.ReasonAmountInvalid},
		{name: "a schema version written 1.0", value: with(proposeBase, "v", `1.0`), reason: wire.ReasonUnsupportedVersion},
		{name: "a total limit in another currency", value: with(grantBase, "total_limit", `{"minor_units":50000,"currency":"USD"}`), reason: wire.ReasonCurrencyInvalid},
		{name: "a total limit below the per-use maximum", value: with(grantBase, "total_limit", `{"minor_units":1,"currency":"EUR"}`), reason: wire.ReasonAmountInvalid},
		{name: "a timestamp written in 2000 that is 1999 in UTC", value: with(proposeBase, "sent_at", `"2000-01-01T00:30:00+01:00"`), reason: wire.ReasonTimestampInvalid},
		{name: "valid until before valid from", value: with(grantBase, "valid_from", `"2026-12-01T00:00:00Z"`, "valid_until", `"2026-11-30T00:00:00Z"`), reason: wire.ReasonTimestampInvalid},
		{name: "a 300-character reason of two-byte letters", value: with(revokeBase, "reason", `"`+strings.Repeat("é", 300)+`"`), reason: wire.ReasonFieldInvalid},
		{name: "a record key naming another mandate", key: "acme/other", value: with(proposeBase), reason: wire.ReasonKeyMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, validate(t, "command", tc.value))
			cmd, rej := wire.Decode(recordKey(tc.key), tc.value, wire.Limits{})
			require.Nil(t, cmd)
			require.Equal(t, tc.reason, rej.Reason, rej.Detail)
		})
	}
}

// TestCurrencyEnumMatchesDecoder compares the schema's enum with the
// decoder's table over every three-letter upper-case code.
func TestCurrencyEnumMatchesDecoder(t *testing.T) {
	t.Parallel()
	var defs struct {
		Defs struct {
			Currency struct {
				Enum []string `json:"enum"`
			} `json:"currency"`
		} `json:"$defs"`
	}
	b, err := wire.Schemas.ReadFile("schema/defs.schema.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &defs))
	inEnum := map[string]bool{}
	for _, c := range defs.Defs.Currency.Enum {
		inEnum[c] = true
	}
	require.Len(t, inEnum, len(defs.Defs.Currency.Enum), "duplicates in the enum")
	require.Greater(t, len(inEnum), 150)
	for a := 'A'; a <= 'Z'; a++ {
		for b := 'A'; b <= 'Z'; b++ {
			for c := 'A'; c <= 'Z'; c++ {
				code := string([]rune{a, b, c})
				require.Equal(t, wire.ValidCurrency(code), inEnum[code], code)
			}
		}
	}
}

// stringConstants returns the values of the string constants of a named
// type declared in one of this package's files.
func stringConstants(t *testing.T, file, typeName string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	require.NoError(t, err)
	var out []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			id, ok := vs.Type.(*ast.Ident)
			if !ok || id.Name != typeName {
				continue
			}
			for _, v := range vs.Values {
				lit := v.(*ast.BasicLit)
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				out = append(out, s)
			}
		}
	}
	require.NotEmpty(t, out, "no %s constants in %s", typeName, file)
	return out
}

// TestDecisionSchemaEnumsMatchTheCode reads the Go constants so that a new
// reason code, outcome or state cannot be added without the schema.
func TestDecisionSchemaEnumsMatchTheCode(t *testing.T) {
	t.Parallel()
	var schema struct {
		Properties struct {
			Command struct{ Enum []string } `json:"command"`
			Outcome struct{ Enum []string } `json:"outcome"`
			Reason  struct{ Enum []string } `json:"reason"`
		} `json:"properties"`
		Defs struct {
			Authorization struct {
				Properties struct {
					State struct{ Enum []string } `json:"state"`
				} `json:"properties"`
			} `json:"authorization"`
			Mandate struct {
				Properties struct {
					Status struct{ Enum []string } `json:"status"`
				} `json:"properties"`
			} `json:"mandate"`
		} `json:"$defs"`
	}
	b, err := wire.Schemas.ReadFile("schema/decision.schema.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &schema))

	require.ElementsMatch(t, stringConstants(t, "reason.go", "Reason"), schema.Properties.Reason.Enum)
	require.ElementsMatch(t, stringConstants(t, "decision.go", "Outcome"), schema.Properties.Outcome.Enum)
	require.ElementsMatch(t, stringConstants(t, "decision.go", "AuthState"), schema.Defs.Authorization.Properties.State.Enum)
	require.ElementsMatch(t, stringConstants(t, "decision.go", "MandateStatus"), schema.Defs.Mandate.Properties.Status.Enum)
	require.ElementsMatch(t, append(slices.Clone(commandTypes), wire.CommandTimer, wire.CommandUndecodable), schema.Properties.Command.Enum)
	require.ElementsMatch(t, commandTypes, stringConstants(t, "command.go", "CommandType"))
}

// exampleRun replays the golden examples through the lifecycle as the
// processor would: grant on the grants topic, then the proposals. It
// returns every decision, encoded.
type exampleRun struct {
	t   *testing.T
	st  *lifecycle.State
	key partitioner.MandateKey
	all [][]byte
}

const examplePartitions = 12

func newExampleRun(t *testing.T) *exampleRun {
	key := partitioner.MandateKey{Org: "acme", MandateID: "refund-case-1842"}
	st := lifecycle.NewState(key.Partition(examplePartitions), 7, 100, func(string) time.Duration { return 30 * 24 * time.Hour })
	return &exampleRun{t: t, st: st, key: key}
}

func (r *exampleRun) decide(example, topic string, offset int64, now string) []wire.Decision {
	r.t.Helper()
	cmd, rej := wire.Decode(r.key.Bytes(), readExample(r.t, example), wire.Limits{})
	require.Nil(r.t, rej)
	at, err := time.Parse(time.RFC3339Nano, now)
	require.NoError(r.t, err)
	ds := r.st.Decide(lifecycle.Input{Cmd: cmd, Source: wire.Source{Topic: topic, Partition: r.st.Partition, Offset: offset}}, at)
	for i := range ds {
		b, err := ds[i].Encode()
		require.NoError(r.t, err)
		r.all = append(r.all, b)
	}
	return ds
}

// TestExamplesReplayThroughTheLifecycle makes the examples true: the propose
// example reserves the authorization the other examples address, its
// decision is the decision example, and every decision of the scenarios
// passes the decision schema and parses back.
func TestExamplesReplayThroughTheLifecycle(t *testing.T) {
	t.Parallel()

	// grant, propose, begin, report_unknown, resolve.
	r := newExampleRun(t)
	require.Equal(t, wire.OutcomeGranted, r.decide("grant", "mandate.grants", 17, "2026-11-30T08:00:00Z")[0].Outcome)
	reserved := r.decide("propose", "mandate.proposals", 1842, "2026-11-30T08:05:00.5Z")
	require.Len(t, reserved, 1)
	require.Equal(t, wire.OutcomeReserved, reserved[0].Outcome)
	require.Equal(t, exampleAuthID, reserved[0].AuthorizationID)
	require.Equal(t, wire.OutcomeExecuting, r.decide("begin", "mandate.proposals", 1843, "2026-11-30T08:06:00Z")[0].Outcome)
	require.Equal(t, wire.OutcomeInDoubt, r.decide("report_unknown", "mandate.proposals", 1844, "2026-11-30T08:07:00Z")[0].Outcome)
	require.Equal(t, wire.OutcomeCommitted, r.decide("resolve", "mandate.grants", 18, "2026-11-30T09:00:00Z")[0].Outcome)
	require.Equal(t, wire.OutcomeRevoked, r.decide("revoke", "mandate.grants", 19, "2026-12-01T09:30:00Z")[0].Outcome)

	// grant, propose, begin, commit with its token and result; and grant,
	// propose, begin, cancel with proof.
	r2 := newExampleRun(t)
	r2.decide("grant", "mandate.grants", 17, "2026-11-30T08:00:00Z")
	r2.decide("propose", "mandate.proposals", 1842, "2026-11-30T08:05:00.5Z")
	r2.decide("begin", "mandate.proposals", 1843, "2026-11-30T08:05:30Z")
	committed := r2.decide("commit", "mandate.proposals", 1844, "2026-11-30T08:06:00Z")[0]
	require.Equal(t, wire.OutcomeCommitted, committed.Outcome)
	require.Equal(t, int64(1), committed.ExecutionToken)
	require.JSONEq(t, `{"amount":15000,"currency":"eur","id":"re_3PqX9a2eZvKYlo2C1xQ","status":"succeeded"}`, string(committed.Authorization.Result))
	r3 := newExampleRun(t)
	r3.decide("grant", "mandate.grants", 17, "2026-11-30T08:00:00Z")
	r3.decide("propose", "mandate.proposals", 1842, "2026-11-30T08:05:00.5Z")
	r3.decide("begin", "mandate.proposals", 1843, "2026-11-30T08:06:00Z")
	require.Equal(t, wire.OutcomeCancelled, r3.decide("cancel", "mandate.proposals", 1844, "2026-11-30T08:06:30Z")[0].Outcome)

	for _, b := range slices.Concat(r.all, r2.all, r3.all) {
		require.NoError(t, validate(t, "decision", b), "%s", b)
		d, err := wire.ParseDecision(b)
		require.NoError(t, err)
		again, err := d.Encode()
		require.NoError(t, err)
		require.JSONEq(t, string(b), string(again))
	}

	// The example is published as the partition's first chained record
	// after sequence 100.
	enc, err := reserved[0].Encode()
	require.NoError(t, err)
	sealed, _ := wire.Seal(enc, wire.Anchor(reserved[0].Partition, reserved[0].Sequence-1))
	require.NoError(t, validate(t, "decision", sealed), "%s", sealed)
	published, err := wire.ParseDecision(sealed)
	require.NoError(t, err)
	got, err := json.MarshalIndent(published, "", "  ")
	require.NoError(t, err)
	path := filepath.Join("testdata", "examples", "decision.json")
	if *update {
		require.NoError(t, os.WriteFile(path, append(got, '\n'), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got), "run go test -run TestExamplesReplayThroughTheLifecycle -update to accept")
}

// TestReplayOrForkDecisionsPassTheSchema runs the propose example's intent
// through a restore, a fork and a possible replay: every decision passes
// the decision schema and parses back.
func TestReplayOrForkDecisionsPassTheSchema(t *testing.T) {
	t.Parallel()
	r := newExampleRun(t)
	r.st.Replay = map[string]lifecycle.ReplaySetting{"acme": {Window: time.Hour, Policy: lifecycle.ReplayFlag}}
	r.decide("grant", "mandate.grants", 17, "2026-11-30T08:00:00Z")
	first := r.decide("propose", "mandate.proposals", 1842, "2026-11-30T08:05:00.5Z")[0]
	variant := func(key, forkOf string, intent bool) *wire.Command {
		cmd, rej := wire.Decode(r.key.Bytes(), readExample(t, "propose"), wire.Limits{})
		require.Nil(t, rej)
		cmd.IdempotencyKey, cmd.Propose.ForkOf, cmd.Propose.Deadline, cmd.Propose.BasedOnVersion = key, forkOf, time.Time{}, 0
		if !intent {
			cmd.Propose.Intent = nil
		}
		return cmd
	}
	decide := func(cmd *wire.Command, offset int64, now string) wire.Decision {
		at, err := time.Parse(time.RFC3339Nano, now)
		require.NoError(t, err)
		ds := r.st.Decide(lifecycle.Input{Cmd: cmd, Source: wire.Source{Topic: "mandate.proposals", Partition: r.st.Partition, Offset: offset}}, at)
		for i := range ds {
			b, err := ds[i].Encode()
			require.NoError(t, err)
			r.all = append(r.all, b)
		}
		return ds[len(ds)-1]
	}
	live := decide(variant("refund-1842-restored-1", first.AuthorizationID, true), 1843, "2026-11-30T08:05:30Z")
	require.Equal(t, wire.ReasonForkOfLive, live.Reason)
	r.decide("begin", "mandate.proposals", 1850, "2026-11-30T08:05:45Z")
	r.decide("commit", "mandate.proposals", 1844, "2026-11-30T08:06:00Z")
	replayed := decide(variant("refund-1842-restored-2", "", true), 1845, "2026-11-30T08:07:00Z")
	require.Equal(t, wire.ReasonIntentReplayed, replayed.Reason)
	other := variant("refund-1842-restored-3", "", true)
	other.Propose.Amount.MinorUnits, other.Propose.Target = 9000, "customer-78"
	differs := decide(other, 1849, "2026-11-30T08:07:30Z")
	require.Equal(t, []string{"amount", "target"}, differs.Differs)
	fork := decide(variant("refund-1842-second-refund", first.AuthorizationID, true), 1846, "2026-11-30T08:08:00Z")
	require.Equal(t, wire.OutcomeDenied, fork.Outcome, "a single-use mandate: the fork is decided, and denied")
	require.Equal(t, first.AuthorizationID, fork.ForkOf)
	unknown := decide(variant("refund-1842-third", "au_none", true), 1847, "2026-11-30T08:09:00Z")
	require.Equal(t, wire.ReasonForkOfUnknown, unknown.Reason)
	flagged := decide(variant("refund-1842-no-intent", "", false), 1848, "2026-11-30T08:10:00Z")
	require.Equal(t, first.AuthorizationID, flagged.PossibleReplay)
	for _, b := range r.all {
		require.NoError(t, validate(t, "decision", b), "%s", b)
		d, err := wire.ParseDecision(b)
		require.NoError(t, err)
		again, err := d.Encode()
		require.NoError(t, err)
		require.JSONEq(t, string(b), string(again))
	}
}

// TestRecordDecisionsPassTheSchema runs the record example through a
// look-up, the record, a repeat with another result, one with another
// target, and one on a mandate that does not exist: every decision passes
// the decision schema and parses back.
func TestRecordDecisionsPassTheSchema(t *testing.T) {
	t.Parallel()
	r := newExampleRun(t)
	r.decide("grant", "mandate.grants", 17, "2026-11-30T08:00:00Z")
	decide := func(value []byte, offset int64, now string) wire.Decision {
		cmd, rej := wire.Decode(r.key.Bytes(), value, wire.Limits{})
		require.Nil(t, rej)
		at, err := time.Parse(time.RFC3339Nano, now)
		require.NoError(t, err)
		ds := r.st.Decide(lifecycle.Input{Cmd: cmd, Source: wire.Source{Topic: "mandate.proposals", Partition: r.st.Partition, Offset: offset}}, at)
		require.Len(t, ds, 1)
		b, err := ds[0].Encode()
		require.NoError(t, err)
		r.all = append(r.all, b)
		return ds[0]
	}
	example := readExample(t, "record")
	var lookup map[string]any
	require.NoError(t, json.Unmarshal(example, &lookup))
	delete(lookup, "result")
	lookupBytes, err := json.Marshal(lookup)
	require.NoError(t, err)

	require.Equal(t, wire.ReasonNotRecorded, decide(lookupBytes, 1842, "2026-11-30T08:04:00Z").Reason)
	rec := decide(example, 1843, "2026-11-30T08:04:10.5Z")
	require.Equal(t, wire.OutcomeRecorded, rec.Outcome)
	require.Equal(t, "record:price.lookup", rec.Binds.Intent.Operation)
	again := decide(with(recordBase, "target", `"sku-4711"`, "result", `{"price":1}`), 1844, "2026-11-30T08:05:00Z")
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.JSONEq(t, string(rec.Authorization.Result), string(again.Authorization.Result))
	other := decide(with(recordBase, "target", `"sku-4712"`), 1845, "2026-11-30T08:06:00Z")
	require.Equal(t, []string{"target"}, other.Differs)
	bare := decide(with(recordBase, "intent", `{"run_id":"run-7f3a","step":"3","action":"price.lookup"}`, "result", `{}`), 1846, "2026-11-30T08:07:00Z")
	require.Equal(t, wire.OutcomeRecorded, bare.Outcome)
	require.Empty(t, bare.Authorization.Target)
	for _, b := range r.all {
		require.NoError(t, validate(t, "decision", b), "%s", b)
		d, err := wire.ParseDecision(b)
		require.NoError(t, err)
		again, err := d.Encode()
		require.NoError(t, err)
		require.JSONEq(t, string(b), string(again))
		require.NotContains(t, string(b), `"amount":{"minor_units":0`, "a record holds no amount")
	}
	// A recorded authorization must not show an amount, and any other
	// one must.
	var dec map[string]any
	require.NoError(t, json.Unmarshal(r.all[2], &dec)) // the recorded one (after the grant and the look-up)
	dec["authorization"].(map[string]any)["amount"] = map[string]any{"minor_units": 1, "currency": "EUR"}
	b, err := json.Marshal(dec)
	require.NoError(t, err)
	require.Error(t, validate(t, "decision", b))
	dec["authorization"].(map[string]any)["state"] = "committed"
	delete(dec["authorization"].(map[string]any), "amount")
	b, err = json.Marshal(dec)
	require.NoError(t, err)
	require.Error(t, validate(t, "decision", b))
}

func TestDecisionExampleIsValid(t *testing.T) {
	t.Parallel()
	raw := readExample(t, "decision")
	require.NoError(t, validate(t, "decision", raw))
	d, err := wire.ParseDecision(raw)
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	require.Equal(t, wire.DecisionID(d.Partition, d.Sequence), d.DecisionID)
	require.Equal(t, &wire.Source{Topic: "mandate.proposals", Partition: d.Partition, Offset: 1842}, d.Source)
	require.Equal(t, wire.StateReserved, d.Authorization.State)
	require.Equal(t, exampleAuthID, d.Authorization.ID)
	require.Equal(t, wire.Money{MinorUnits: 15000, Currency: "EUR"}, d.Authorization.Amount)
	require.Equal(t, time.Date(2026, 11, 30, 8, 9, 0, 0, time.UTC), d.Authorization.Deadline)
	require.Equal(t, int64(1), d.Mandate.UsesHeld)
}

func TestInvalidDecisionsFailTheSchema(t *testing.T) {
	t.Parallel()
	var good map[string]any
	require.NoError(t, json.Unmarshal(readExample(t, "decision"), &good))
	cases := []struct {
		name   string
		change func(d map[string]any)
	}{
		{name: "an unknown outcome", change: func(d map[string]any) { d["outcome"] = "maybe" }},
		{name: "an unknown reason code", change: func(d map[string]any) { d["reason"] = "because" }},
		{name: "an extra field", change: func(d map[string]any) { d["admin"] = true }},
		{name: "no decision id", change: func(d map[string]any) { delete(d, "decision_id") }},
		{name: "a hash in upper case", change: func(d map[string]any) { d["hash"] = strings.ToUpper(d["hash"].(string)) }},
		{name: "a prev_hash too short", change: func(d map[string]any) { d["prev_hash"] = "abc" }},
		{name: "a fractional sequence", change: func(d map[string]any) { d["sequence"] = 1.5 }},
		{name: "a negative partition", change: func(d map[string]any) { d["partition"] = -1 }},
		{name: "a decided_at that is not a timestamp", change: func(d map[string]any) { d["decided_at"] = "yesterday" }},
		{name: "an authorization in an unknown state", change: func(d map[string]any) {
			d["authorization"].(map[string]any)["state"] = "pending"
		}},
		{name: "an authorization with a zero amount", change: func(d map[string]any) {
			d["authorization"].(map[string]any)["amount"] = map[string]any{"minor_units": 0, "currency": "EUR"}
		}},
		{name: "a mandate with negative uses held", change: func(d map[string]any) { d["mandate"].(map[string]any)["uses_held"] = -1 }},
		{name: "a source without an offset", change: func(d map[string]any) { delete(d["source"].(map[string]any), "offset") }},
		{name: "an execution token of zero", change: func(d map[string]any) { d["execution_token"] = 0 }},
		{name: "a result that is not an object", change: func(d map[string]any) { d["authorization"].(map[string]any)["result"] = "ok" }},
		{name: "an executor outside the id grammar", change: func(d map[string]any) { d["authorization"].(map[string]any)["executor"] = "worker 1" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var d map[string]any
			b, err := json.Marshal(good)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &d))
			tc.change(d)
			bad, err := json.Marshal(d)
			require.NoError(t, err)
			require.Error(t, validate(t, "decision", bad))
		})
	}
}
