package wire_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

func TestParseDataRefusesWhatDecodersReadDifferently(t *testing.T) {
	t.Parallel()
	got, rej := wire.ParseData([]byte(` {"a": 1.50, "memo": "two\nlines\ttab", "nested": {"b": [1, {"c": null}]}} `))
	require.Nil(t, rej)
	require.Equal(t, map[string]any{"a": json.Number("1.50"), "memo": "two\nlines\ttab",
		"nested": map[string]any{"b": []any{json.Number("1"), map[string]any{"c": nil}}}}, got)

	for _, tc := range []struct{ name, raw, want string }{
		{"a duplicate member", `{"amount_cents": 5, "amount_cents": 500000}`, `ambiguous_field: key "amount_cents" appears twice`},
		{"a case-variant member", `{"amount_cents": 5, "AMOUNT_CENTS": 500000}`, `keys "amount_cents" and "AMOUNT_CENTS" differ only in case`},
		{"a case-variant member deeper down", `{"x": [{"id": 1, "Id": 2}]}`, `keys "id" and "Id" differ only in case`},
		{"an escape character", `{"memo": "\u001b[31m"}`, "control character U+001B"},
		{"not an object", `[1]`, "not a JSON object"},
		{"trailing data", `{} {}`, "trailing data"},
		{"nested too deep", strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40), "nested deeper than 32"},
	} {
		_, rej := wire.ParseData([]byte(tc.raw))
		require.NotNil(t, rej, tc.name)
		require.Contains(t, rej.Error(), tc.want, tc.name)
	}
}
