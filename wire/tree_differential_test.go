package wire

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzScannerAgreesWithEncodingJSON is a two-way differential test of the
// hand-written scanner against encoding/json on arbitrary bytes: whatever
// the scanner accepts, encoding/json accepts too and reads as the same tree
// (the same strings after every escape, the same number literals, the same
// nesting); and whatever encoding/json accepts as an object, the scanner
// never calls malformed (it may refuse it only for a strictness rule:
// duplicate keys, control characters, lone surrogates, limits).
func FuzzScannerAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"type":"propose","org":"acme","mandate_id":"m","amount":{"minor_units":15000,"currency":"EUR"}}`,
		`{"a":"\u0041\u00e9\u20ac\ud83d\ude00","b":"\"\\\/\b\f\n\r\t","c":"plain","d":"é€😀"}`,
		`{"n":[0,-0,1,-1,12.5,1e3,1E-3,-0.0e+0,123456789012345678901234567890]}`,
		`{"nested":{"x":[true,false,null,{"y":[]},{}]}}`,
		` {"ws" : [ 1 , "2" ] } `,
		`{"k\u0065y":"value with escaped key"}`,
		`{"a":"x\/y \"q\" \\ \u00e9"}`,
		`{"dup":1,"dup":2}`,
		`{"Org":"a","org":"b"}`,
		`{"s":"\ud800"}`,
		`{"s":"\ud800\u0041"}`,
		`{"s":"a\u0000b"}`,
		`{"s":"\u007f"}`,
		`{"n":01}`,
		`{"n":1.}`,
		`{"n":-}`,
		`{"n":.5}`,
		`{"t":tru}`,
		`{} x`,
		`[1,2]`,
		`"str"`,
		"{\"s\":\"\xff\"}",
		"\xef\xbb\xbf{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		tree, perr := parseObject(value, defaultTreeLimits)
		valid := json.Valid(value)
		if perr == nil {
			require.True(t, valid, "the scanner accepted what encoding/json rejects: %q", value)
			d := json.NewDecoder(bytes.NewReader(value))
			d.UseNumber()
			var want any
			require.NoError(t, d.Decode(&want))
			require.Equal(t, want, plainTree(tree), "the scanner and encoding/json read %q differently", value)
			return
		}
		if perr.reason == ReasonMalformedJSON && valid {
			trimmed := bytes.TrimLeft(value, " \t\r\n")
			require.False(t, len(trimmed) > 0 && trimmed[0] == '{', "the scanner calls a valid JSON object malformed (%s): %q", perr.detail, value)
		}
	})
}

// plainTree turns the scanner's tree into what encoding/json decodes into
// an any (with UseNumber).
func plainTree(v any) any {
	switch x := v.(type) {
	case object:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = plainTree(e)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plainTree(e)
		}
		return out
	}
	return v
}
