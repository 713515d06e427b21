package mcpguard_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
)

func TestMalformedRulesAreRefusedNamingTheBadField(t *testing.T) {
	t.Parallel()
	const good = `
tools:
  refund:
    org: acme
    mandate_id: "case-{case_id}"
    operation: payment.refund
    amount: {minor_units: "{amount_cents}", currency: EUR}
    target: "{order_id}"
    intent: {from: meta}
`
	r, err := mcpguard.ParseRules([]byte(good))
	require.NoError(t, err)
	require.Equal(t, mcpguard.OnToolErrorRecord, r.Tools["refund"].OnToolError, "defaults filled")
	require.Equal(t, "run_id", r.Tools["refund"].Intent.RunIDKey)

	_, err = mcpguard.ParseRules([]byte(`{"tools": {"refund": {"org": "acme", "mandate_id": "m", "operation": "op",
		"amount": {"minor_units": 100, "currency": "EUR"}, "target": "t", "intent": {"from": "args", "args": ["order_id"]}}}}`))
	require.NoError(t, err, "JSON is read too")

	for _, tc := range []struct {
		name, rules, want string
	}{
		{"a file that is not YAML", "tools: [", "rules: yaml:"},
		{"no tools", "tools: {}", "rules: tools: at least one guarded tool is required"},
		{"a misspelt field", "tools:\n  refund:\n    org: acme\n    mandate: m\n", "field mandate not found"},
		{"no org", "tools:\n  refund:\n    mandate_id: m\n", "rules: tools.refund.org: required"},
		{"an org outside the grammar", "tools:\n  refund:\n    org: Acme Corp\n", "rules: tools.refund.org: \"Acme Corp\" is not a valid org"},
		{"no amount", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t}\n", "rules: tools.refund.amount.minor_units: required"},
		{"an amount that is no integer", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: ten, currency: EUR}}\n",
			"rules: tools.refund.amount.minor_units: \"ten\" is neither a non-negative integer nor a template"},
		{"an empty placeholder", "tools:\n  refund: {org: acme, mandate_id: \"m-{}\", operation: op, target: t, amount: {minor_units: 1, currency: EUR}}\n",
			"rules: tools.refund.mandate_id: \"m-{}\" has an empty placeholder {}"},
		{"an unbalanced brace", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: \"{order_id\", amount: {minor_units: 1, currency: EUR}}\n",
			"rules: tools.refund.target: \"{order_id\" has an unbalanced { or }"},
		{"no intent", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: 1, currency: EUR}}\n",
			"rules: tools.refund.intent.from: required: meta (the call's _meta run id and step) or args (named arguments); never a fresh id"},
		{"an unknown intent source", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: 1, currency: EUR}, intent: {from: uuid}}\n",
			"rules: tools.refund.intent.from: \"uuid\" is not meta or args"},
		{"args intent without args", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: 1, currency: EUR}, intent: {from: args}}\n",
			"rules: tools.refund.intent.args: name at least one argument with intent.from args"},
		{"an unknown term to accept differing", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: 1, currency: EUR}, intent: {from: meta}, accept_differs: [reference]}\n",
			"rules: tools.refund.accept_differs: \"reference\" is not one of amount, currency, operation, target"},
		{"an unknown tool-error policy", "tools:\n  refund: {org: acme, mandate_id: m, operation: op, target: t, amount: {minor_units: 1, currency: EUR}, intent: {from: meta}, on_tool_error: retry}\n",
			"rules: tools.refund.on_tool_error: \"retry\" is not record or cancel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mcpguard.ParseRules([]byte(tc.rules))
			require.ErrorContains(t, err, tc.want)
		})
	}
}
