package mcpguard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Rules are the guarded tools of one upstream, read from a YAML or JSON
// file (YAML is a superset of JSON: one decoder reads both):
//
//	tools:
//	  refund:                          # the upstream's tool name
//	    org: acme
//	    mandate_id: "case-{case_id}"   # fixed, or a template over the arguments
//	    operation: payment.refund
//	    amount: {minor_units: "{amount_cents}", currency: EUR}
//	    target: "{order_id}"
//	    intent: {from: meta}           # _meta run_id + step; or {from: args, args: [order_id]}
//	    on_tool_error: record          # or cancel
//
// A template is text with {argument} placeholders: each is replaced by the
// call's argument of that name, a string or an integer. Tools not named
// here pass through unguarded.
type Rules struct {
	Tools map[string]*Rule `yaml:"tools" json:"tools"`
}

// Intent sources of Rule.Intent.From.
const (
	IntentFromMeta = "meta"
	IntentFromArgs = "args"
)

// On-tool-error policies of Rule.OnToolError.
const (
	// OnToolErrorRecord commits a result the upstream marked isError as
	// the recorded result: the use is spent, every repeat gets that error.
	OnToolErrorRecord = "record"
	// OnToolErrorCancel cancels the authorization with the upstream's
	// error text as proof that nothing was executed (the use is released
	// if the mandate's policy allows); for tools whose error result
	// guarantees no effect.
	OnToolErrorCancel = "cancel"
)

// Defaults of Rule.
const (
	RunIDKeyDefault    = "run_id"
	StepKeyDefault     = "step"
	OnToolErrorDefault = OnToolErrorRecord
)

// Rule is how the calls of one guarded tool become proposals.
type Rule struct {
	// Org is the mandate's org. Required.
	Org string `yaml:"org" json:"org"`
	// MandateID is the mandate's id, fixed or a template. Required.
	MandateID string `yaml:"mandate_id" json:"mandate_id"`
	// Operation is the proposal's operation. Required.
	Operation string `yaml:"operation" json:"operation"`
	// Amount is the proposal's amount. Required.
	Amount AmountRule `yaml:"amount" json:"amount"`
	// Target is the proposal's target, fixed or a template. Required.
	Target string `yaml:"target" json:"target"`
	// Intent is how a call's idempotency key is derived. Required.
	Intent IntentRule `yaml:"intent" json:"intent"`
	// OnToolError is OnToolErrorRecord or OnToolErrorCancel. Defaults to
	// OnToolErrorDefault.
	OnToolError string `yaml:"on_tool_error" json:"on_tool_error"`
	// AcceptDiffers are the terms ("amount", "currency", "operation",
	// "target") a repeat of an intent may carry regenerated: a replay that
	// differs only in them is answered with the recorded result. A replay
	// that differs in any other is a tool error naming them. Defaults to
	// none.
	AcceptDiffers []string `yaml:"accept_differs" json:"accept_differs"`
	// Recorded marks a read-only tool (a search, a price lookup) whose
	// answer a restored or resumed agent must see again, not fetched anew
	// (seed 003): the first call of an intent is forwarded and its answer
	// recorded under the intent (mandated's record command); every repeat
	// gets the recorded answer without the upstream being called. A
	// recorded read takes no authority (it has no amount) and never blocks
	// an effect. Defaults to false.
	Recorded bool `yaml:"recorded" json:"recorded"`
}

// Terms a replay may differ in (wire: a replayed decision's differs).
var differTerms = []string{"amount", "currency", "operation", "target"}

// AmountRule is the proposal's amount: minor units fixed ("500") or a
// template ("{amount_cents}") that yields an integer; the currency fixed
// or a template.
type AmountRule struct {
	MinorUnits string `yaml:"minor_units" json:"minor_units"`
	Currency   string `yaml:"currency" json:"currency"`
}

// IntentRule derives the idempotency key of a call from facts that stay
// the same when an agent repeats it, never from a fresh id.
type IntentRule struct {
	// From is IntentFromMeta (the call's _meta run id and step) or
	// IntentFromArgs (the named arguments). Required.
	From string `yaml:"from" json:"from"`
	// Args are the arguments that name the intent, with From args.
	Args []string `yaml:"args" json:"args"`
	// RunIDKey and StepKey are the _meta keys read with From meta.
	// Default to RunIDKeyDefault and StepKeyDefault.
	RunIDKey string `yaml:"run_id_key" json:"run_id_key"`
	StepKey  string `yaml:"step_key" json:"step_key"`
}

// LoadRules reads and validates a rules file.
func LoadRules(path string) (*Rules, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	r, err := ParseRules(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseRules reads rules from YAML or JSON and validates them. Unknown
// fields are errors: a misspelt field must not silently unguard a tool.
func ParseRules(b []byte) (*Rules, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var r Rules
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

var placeholder = regexp.MustCompile(`\{([^{}]*)\}`)

// Validate names the first bad field, as tools.<tool>.<field>.
func (r *Rules) Validate() error {
	if len(r.Tools) == 0 {
		return errors.New("rules: tools: at least one guarded tool is required")
	}
	for _, name := range r.names() {
		rule := r.Tools[name]
		at := "rules: tools." + name
		if rule == nil {
			return fmt.Errorf("%s: the tool's rule is empty", at)
		}
		if err := rule.validate(); err != nil {
			return fmt.Errorf("%s.%w", at, err)
		}
	}
	return nil
}

// clone copies the rules and each tool's rule (the fields validation
// fills in); nil stays nil.
func (r *Rules) clone() *Rules {
	if r == nil {
		return nil
	}
	out := &Rules{Tools: make(map[string]*Rule, len(r.Tools))}
	for name, rule := range r.Tools {
		if rule != nil {
			c := *rule
			rule = &c
		}
		out.Tools[name] = rule
	}
	return out
}

func (r *Rules) names() []string {
	out := make([]string, 0, len(r.Tools))
	for n := range r.Tools {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (r *Rule) validate() error {
	r.OnToolError = cmpOr(r.OnToolError, OnToolErrorDefault)
	r.Intent.RunIDKey = cmpOr(r.Intent.RunIDKey, RunIDKeyDefault)
	r.Intent.StepKey = cmpOr(r.Intent.StepKey, StepKeyDefault)
	switch {
	case r.Org == "":
		return errors.New("org: required")
	case !partitioner.ValidOrg(r.Org):
		return fmt.Errorf("org: %q is not a valid org (lower-case id grammar)", r.Org)
	case r.MandateID == "":
		return errors.New("mandate_id: required (fixed, or a template such as \"case-{case_id}\")")
	case r.Operation == "":
		return errors.New("operation: required")
	case r.Recorded && (r.Amount.MinorUnits != "" || r.Amount.Currency != ""):
		return errors.New("amount: not with recorded: a recorded read takes no authority")
	case r.Recorded && len(r.AcceptDiffers) > 0:
		return errors.New("accept_differs: not with recorded: a read's repeat is answered its first result")
	case !r.Recorded && r.Amount.MinorUnits == "":
		return errors.New("amount.minor_units: required (an integer, or a template such as \"{amount_cents}\")")
	case !r.Recorded && r.Amount.Currency == "":
		return errors.New("amount.currency: required (ISO 4217, or a template)")
	case r.Target == "":
		return errors.New("target: required (fixed, or a template such as \"{order_id}\")")
	}
	for field, tmpl := range map[string]string{"mandate_id": r.MandateID, "target": r.Target,
		"amount.minor_units": r.Amount.MinorUnits, "amount.currency": r.Amount.Currency} {
		if err := checkTemplate(tmpl); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	if !hasPlaceholder(r.MandateID) && !partitioner.ValidID(r.MandateID) {
		return fmt.Errorf("mandate_id: %q is outside the id grammar [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", r.MandateID)
	}
	if !r.Recorded && !hasPlaceholder(r.Amount.MinorUnits) {
		if n, err := strconv.ParseInt(r.Amount.MinorUnits, 10, 64); err != nil || n < 0 {
			return fmt.Errorf("amount.minor_units: %q is neither a non-negative integer nor a template", r.Amount.MinorUnits)
		}
	}
	switch r.Intent.From {
	case IntentFromMeta:
		if len(r.Intent.Args) > 0 {
			return errors.New("intent.args: only with intent.from args")
		}
	case IntentFromArgs:
		if len(r.Intent.Args) == 0 {
			return errors.New("intent.args: name at least one argument with intent.from args")
		}
	case "":
		return errors.New("intent.from: required: meta (the call's _meta run id and step) or args (named arguments); never a fresh id")
	default:
		return fmt.Errorf("intent.from: %q is not meta or args", r.Intent.From)
	}
	if r.OnToolError != OnToolErrorRecord && r.OnToolError != OnToolErrorCancel {
		return fmt.Errorf("on_tool_error: %q is not record or cancel", r.OnToolError)
	}
	for _, f := range r.AcceptDiffers {
		if !slices.Contains(differTerms, f) {
			return fmt.Errorf("accept_differs: %q is not one of %s", f, strings.Join(differTerms, ", "))
		}
	}
	return nil
}

// arguments are the argument names the rule reads.
func (r *Rule) arguments() []string {
	var out []string
	for _, tmpl := range []string{r.MandateID, r.Target, r.Amount.MinorUnits, r.Amount.Currency} {
		for _, m := range placeholder.FindAllStringSubmatch(tmpl, -1) {
			out = append(out, m[1])
		}
	}
	return append(out, r.Intent.Args...)
}

func checkTemplate(t string) error {
	for _, m := range placeholder.FindAllStringSubmatch(t, -1) {
		if m[1] == "" {
			return fmt.Errorf("%q has an empty placeholder {}", t)
		}
	}
	rest := placeholder.ReplaceAllString(t, "")
	if strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("%q has an unbalanced { or }", t)
	}
	return nil
}

func hasPlaceholder(t string) bool { return placeholder.MatchString(t) }

// ArgumentError is a call whose arguments do not give what its rule needs.
type ArgumentError struct{ Msg string }

func (e *ArgumentError) Error() string { return e.Msg }

// expand fills a template from the call's arguments.
func expand(field, tmpl string, args map[string]any) (string, error) {
	var err error
	out := placeholder.ReplaceAllStringFunc(tmpl, func(m string) string {
		name := m[1 : len(m)-1]
		v, ok := args[name]
		if !ok {
			if err == nil {
				err = &ArgumentError{fmt.Sprintf("%s needs the argument %q, which the call does not have", field, name)}
			}
			return ""
		}
		s, ok := scalar(v)
		if !ok && err == nil {
			err = &ArgumentError{fmt.Sprintf("%s needs the argument %q as a string or an integer, not %s", field, name, compactJSON(v))}
		}
		return s
	})
	return out, err
}

// scalar is a template's value: a string, or an integer however it is
// written (777, 777.0 and 7.77e2 all pass an integer schema).
func scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		n := normNumber(string(x))
		if _, err := strconv.ParseInt(n, 10, 64); err == nil {
			return n, true
		}
	}
	return "", false
}

// normNumber writes a JSON number in one form per value: an integer value
// as its digits (777.0, 7.77e2 -> 777; -0 -> 0), any other as
// <digits>e<exponent> without leading or trailing zeros (1.50 -> 15e-1).
// Huge exponents keep the exponent form.
func normNumber(number string) string {
	neg := strings.HasPrefix(number, "-")
	s := strings.TrimPrefix(number, "-")
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil {
			return number // an exponent beyond int: kept as written
		}
		exp = e
	}
	digits := mant
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		digits = mant[:i] + mant[i+1:]
		exp -= len(mant) - i - 1
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0"
	}
	for strings.HasSuffix(digits, "0") {
		digits = digits[:len(digits)-1]
		exp++
	}
	sign := ""
	if neg {
		sign = "-"
	}
	if exp >= 0 && len(digits)+exp <= 40 {
		return sign + digits + strings.Repeat("0", exp)
	}
	return sign + digits + "e" + strconv.Itoa(exp)
}

// normNumbers replaces every number in v by its normNumber form.
func normNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		return json.Number(normNumber(string(x)))
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = normNumbers(e)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normNumbers(e)
		}
		return out
	}
	return v
}

func compactJSON(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 80 {
		b = append(b[:77], "..."...)
	}
	return string(b)
}

// proposal is what one call of a guarded tool proposes.
type proposal struct {
	Org, MandateID, Operation, Target string
	Amount                            wire.Money
	IdempotencyKey                    string
	Intent                            *wire.Intent
}

// propose derives the call's proposal from its arguments and _meta.
func (r *Rule) propose(tool string, args map[string]any, meta map[string]any) (*proposal, error) {
	p := &proposal{Org: r.Org, Operation: r.Operation}
	var err error
	if p.MandateID, err = expand("mandate_id", r.MandateID, args); err != nil {
		return nil, err
	}
	if !partitioner.ValidID(p.MandateID) {
		return nil, &ArgumentError{fmt.Sprintf("mandate_id %q (from the arguments) is outside the id grammar", p.MandateID)}
	}
	if p.Target, err = expand("target", r.Target, args); err != nil {
		return nil, err
	}
	if !r.Recorded {
		units, err := expand("amount.minor_units", r.Amount.MinorUnits, args)
		if err != nil {
			return nil, err
		}
		if p.Amount.MinorUnits, err = strconv.ParseInt(units, 10, 64); err != nil || p.Amount.MinorUnits < 0 {
			return nil, &ArgumentError{fmt.Sprintf("amount.minor_units %q (from the arguments) is not a non-negative integer", units)}
		}
		if p.Amount.Currency, err = expand("amount.currency", r.Amount.Currency, args); err != nil {
			return nil, err
		}
	}
	action := idSafe("mcp." + tool)
	switch r.Intent.From {
	case IntentFromMeta:
		// The run id and step name the step; the target tells apart two
		// calls of the tool in one step (two orders refunded), while a
		// repeat of the same call (its other arguments regenerated) keeps
		// its intent. Two calls for one target in one step are one intent:
		// a repeat that differs is told so, never run again.
		action = metaAction(tool, p.Target)
		run, ok1 := metaString(meta, r.Intent.RunIDKey)
		step, ok2 := metaString(meta, r.Intent.StepKey)
		if !ok1 || !ok2 {
			return nil, &ArgumentError{fmt.Sprintf("the call's _meta has no %q and %q (strings or integers): tool %s derives its intent from the caller's run id and step, never from a fresh id",
				r.Intent.RunIDKey, r.Intent.StepKey, tool)}
		}
		p.IdempotencyKey = wire.IntentKey(run, step, action)
		if partitioner.ValidID(run) && partitioner.ValidID(step) {
			p.Intent = &wire.Intent{RunID: run, Step: step, Action: action}
		}
	case IntentFromArgs:
		vals := make([]any, 0, len(r.Intent.Args))
		for _, a := range r.Intent.Args {
			v, ok := args[a]
			if !ok {
				return nil, &ArgumentError{fmt.Sprintf("intent needs the argument %q, which the call does not have", a)}
			}
			vals = append(vals, v)
		}
		// Map keys sorted, numbers in one form per value: the same values
		// however they are written are one intent.
		b, _ := json.Marshal(normNumbers(vals))
		sum := sha256.Sum256(b)
		p.IdempotencyKey = wire.IntentKey("mcp-args", hex.EncodeToString(sum[:16]), action)
		if r.Recorded { // a record is kept under an intent
			p.Intent = &wire.Intent{RunID: "mcp-args", Step: hex.EncodeToString(sum[:16]), Action: action}
		}
	}
	return p, nil
}

// metaAction is the intent's action for a call whose intent comes from
// _meta: "mcp.<tool>:<target>", or the target's SHA-256 where the target is
// outside the id grammar or too long.
func metaAction(tool, target string) string {
	base := idSafe("mcp." + tool)
	if a := base + ":" + target; partitioner.ValidID(a) {
		return a
	}
	sum := sha256.Sum256([]byte(target))
	a := base + ":sha256-" + hex.EncodeToString(sum[:16])
	if len(a) > 128 {
		a = base[:128-len(a)+len(base)] + a[len(base):]
	}
	return a
}

func metaString(meta map[string]any, key string) (string, bool) {
	v, ok := meta[key]
	if !ok {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, x != ""
	case float64:
		if x == float64(int64(x)) {
			return strconv.FormatInt(int64(x), 10), true
		}
	case json.Number:
		return x.String(), true
	}
	return "", false
}

// idSafe maps a tool name into the id grammar (MCP tool names may hold
// underscores, ids may not).
func idSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == ':' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
