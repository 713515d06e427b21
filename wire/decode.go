package wire

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
)

// Limits bound what one record may be. Zero fields take the defaults.
type Limits struct {
	// MaxRecordBytes is the largest record value decoded. Defaults to
	// MaxRecordBytesDefault.
	MaxRecordBytes int
}

// MaxRecordBytesDefault is the default record size limit: commands are
// small; anything bigger is a mistake or an attack.
const MaxRecordBytesDefault = 64 << 10

// Field limits of the v1 contract.
const (
	MaxMinorUnits          = int64(1_000_000_000_000_000) // 10^15 minor units
	MaxUses                = int64(1_000_000)
	MaxHoldWindow          = 7 * 24 * time.Hour
	MaxExecutionTimeout    = 7 * 24 * time.Hour
	DefaultHoldWindow      = 5 * time.Minute
	DefaultExecutionTimout = time.Hour
	MaxTextBytes           = 512
	MaxOperations          = 32
	MaxTargets             = 256
)

// grammar is a named character-level rule, checked by a loop (regular
// expressions cost more than the rest of decoding).
type grammar struct {
	text string
	ok   func(string) bool
}

var (
	operationGrammar = grammar{`[a-z][a-z0-9_.-]{0,63}`, func(s string) bool {
		if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
			return false
		}
		for i := 1; i < len(s); i++ {
			if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
				return false
			}
		}
		return true
	}}
	externalRefGrammar = grammar{`[\x21-\x7e]{1,255}`, func(s string) bool {
		if len(s) == 0 || len(s) > 255 {
			return false
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x21 || s[i] > 0x7e {
				return false
			}
		}
		return true
	}}
)

// isJSONInteger reports whether s is -?(0|[1-9][0-9]*).
func isJSONInteger(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if s == "" || s[0] == '0' && len(s) > 1 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isRFC3339 reports whether s has RFC 3339's date-time shape:
// YYYY-MM-DDThh:mm:ss(.fraction of 1-9 digits)?(Z|±hh:mm with hh ≤ 23, mm ≤ 59).
// time.Parse alone also takes forms RFC 3339 does not (T8:00:00Z, 08:00:00,5Z).
func isRFC3339(s string) bool {
	digits := func(from, n int) bool {
		if from+n > len(s) {
			return false
		}
		for i := from; i < from+n; i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return true
	}
	if len(s) < 20 || !digits(0, 4) || s[4] != '-' || !digits(5, 2) || s[7] != '-' || !digits(8, 2) || s[10] != 'T' ||
		!digits(11, 2) || s[13] != ':' || !digits(14, 2) || s[16] != ':' || !digits(17, 2) {
		return false
	}
	i := 19
	if s[i] == '.' {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if n := j - i - 1; n < 1 || n > 9 {
			return false
		}
		i = j
	}
	switch rest := s[i:]; {
	case rest == "Z":
		return true
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		hh, mm := rest[1:3], rest[4:6]
		return digits(i+1, 2) && digits(i+4, 2) && hh <= "23" && mm <= "59"
	}
	return false
}

// Rejection says why a record is not a valid command. Key is set when a
// mandate key could be read (from the record key, or else from the body),
// so the rejection can be answered with a decision; otherwise the record
// goes to the dead-letter topic.
type Rejection struct {
	Reason          Reason
	Detail          string
	Key             *partitioner.MandateKey
	Type            CommandType // when it could be read
	IdempotencyKey  string      // when it could be read
	AuthorizationID string      // when it could be read
}

func (r *Rejection) Error() string { return string(r.Reason) + ": " + r.Detail }

var commonFields = []string{"v", "type", "org", "mandate_id", "idempotency_key", "sent_at"}

var typeFields = map[CommandType][]string{
	CmdGrant:         {"uses", "max_amount", "total_limit", "operations", "targets", "valid_from", "valid_until", "release_on_cancel", "hold_seconds", "execution_timeout_seconds", "based_on_version"},
	CmdRevoke:        {"reason"},
	CmdPropose:       {"operation", "amount", "target", "based_on_version", "deadline", "intent", "fork_of"},
	CmdBegin:         {"authorization_id", "executor"},
	CmdCommit:        {"authorization_id", "external_ref", "execution_token", "result"},
	CmdCancel:        {"authorization_id", "reason", "not_executed_proof", "execution_token"},
	CmdReportUnknown: {"authorization_id", "detail", "execution_token"},
	CmdResolve:       {"authorization_id", "outcome", "external_ref", "evidence", "execution_token", "result", "reconciler"},
	CmdRecord:        {"operation", "target", "intent", "result"},
}

var moneyFields = []string{"minor_units", "currency"}

var intentFields = []string{"run_id", "step", "action"}

// Decode turns one record (its key and value) into a Command, or says why
// it cannot. It never panics and does no I/O.
func Decode(recordKey, value []byte, lim Limits) (*Command, *Rejection) {
	maxBytes := lim.MaxRecordBytes
	if maxBytes <= 0 {
		maxBytes = MaxRecordBytesDefault
	}
	var keyFromRecord *partitioner.MandateKey
	if k, err := partitioner.ParseMandateKey(string(recordKey)); err == nil {
		keyFromRecord = &k
	}
	if len(value) > maxBytes {
		return nil, &Rejection{Reason: ReasonTooLarge, Key: keyFromRecord,
			Detail: fmt.Sprintf("record value is %d bytes; the limit is %d", len(value), maxBytes)}
	}
	obj, perr := parseObject(value, defaultTreeLimits)
	if perr != nil {
		return nil, &Rejection{Reason: perr.reason, Detail: perr.detail, Key: keyFromRecord}
	}

	r := reader{obj: obj}
	rej := &Rejection{Key: keyFromRecord}
	org, _ := obj["org"].(string)
	mandateID, _ := obj["mandate_id"].(string)
	bodyKey, bodyKeyErr := partitioner.NewMandateKey(org, mandateID)
	if rej.Key == nil && bodyKeyErr == nil {
		rej.Key = &bodyKey
	}
	if t, ok := obj["type"].(string); ok && CommandType(t).Known() {
		rej.Type = CommandType(t)
	}
	if s, ok := obj["idempotency_key"].(string); ok && partitioner.ValidID(s) {
		rej.IdempotencyKey = s
	}
	if s, ok := obj["authorization_id"].(string); ok && partitioner.ValidID(s) {
		rej.AuthorizationID = s
	}
	fail := func(reason Reason, format string, args ...any) (*Command, *Rejection) {
		rej.Reason, rej.Detail = reason, fmt.Sprintf(format, args...)
		return nil, rej
	}

	// Version first: a record of a newer contract is answered, not misread.
	v, present := obj["v"]
	if !present {
		return fail(ReasonUnsupportedVersion, "field \"v\" (schema version) is missing; this build speaks v%d", SchemaVersion)
	}
	if n, ok := v.(json.Number); !ok || n.String() != strconv.Itoa(SchemaVersion) {
		return fail(ReasonUnsupportedVersion, "schema version %v is not supported; this build speaks v%d", v, SchemaVersion)
	}
	typ, present := obj["type"]
	if !present || typ == nil {
		return fail(ReasonMissingField, "missing_field:type")
	}
	ts, ok := typ.(string)
	if !ok {
		return fail(ReasonFieldInvalid, "field_invalid:type is not a string")
	}
	ct := CommandType(ts)
	if !ct.Known() {
		return fail(ReasonUnknownCommand, "command type %q is not one of grant, revoke, propose, begin, commit, cancel, report_unknown, resolve", ts)
	}
	if unknown := unknownKeys(obj, commonFields, typeFields[ct], signableFields(ct)); len(unknown) > 0 {
		return fail(ReasonUnknownField, "unknown field(s) %q for a %s command", unknown, ct)
	}

	// Identity: the body must name a valid mandate, and the record key must
	// name the same one. The record key decides the partition; a body that
	// claims another org or mandate is refused, whatever it says.
	if org == "" && mandateID == "" {
		if _, ok := obj["org"]; !ok {
			return fail(ReasonMissingIdentity, "missing_field:org")
		}
	}
	if _, ok := obj["org"]; !ok {
		return fail(ReasonMissingField, "missing_field:org")
	}
	if _, ok := obj["mandate_id"]; !ok {
		return fail(ReasonMissingField, "missing_field:mandate_id")
	}
	if bodyKeyErr != nil {
		return fail(ReasonIDInvalid, "%v", bodyKeyErr)
	}
	if len(recordKey) == 0 {
		return fail(ReasonMissingRecordKey, "the record has no key; produce with key %q", bodyKey.String())
	}
	if keyFromRecord == nil || *keyFromRecord != bodyKey {
		return fail(ReasonKeyMismatch, "record key %q does not name the body's mandate %q", truncate(string(recordKey), 160), bodyKey.String())
	}

	cmd := &Command{Type: ct, Key: bodyKey}
	cmd.IdempotencyKey = r.id("idempotency_key", ct == CmdPropose)
	cmd.SentAt = r.timestamp("sent_at", false)

	switch ct {
	case CmdGrant:
		g := &Grant{
			Uses:            r.integer("uses", true, 1, MaxUses, ReasonFieldInvalid),
			MaxAmount:       r.money("max_amount", true),
			Operations:      r.stringList("operations", 1, MaxOperations, &operationGrammar),
			Targets:         r.stringList("targets", 0, MaxTargets, nil),
			ValidFrom:       r.timestamp("valid_from", false),
			ValidUntil:      r.timestamp("valid_until", false),
			ReleaseOnCancel: r.boolean("release_on_cancel", true),
			HoldWindow:      r.seconds("hold_seconds", DefaultHoldWindow, MaxHoldWindow),
			ExecutionTimeout: r.seconds("execution_timeout_seconds", DefaultExecutionTimout,
				MaxExecutionTimeout),
			BasedOnVersion: r.integer("based_on_version", false, 0, MaxMandateVersion, ReasonFieldInvalid),
		}
		if v, ok := obj["based_on_version"]; ok && v != nil {
			g.BindsVersion = true
		}
		if v, ok := obj["total_limit"]; ok && v != nil {
			m := r.money("total_limit", true)
			g.TotalLimit = &m
			if r.err == nil && m.Currency != g.MaxAmount.Currency {
				r.failf(ReasonCurrencyInvalid, "total_limit currency %s differs from max_amount currency %s", m.Currency, g.MaxAmount.Currency)
			}
			if r.err == nil && m.MinorUnits < g.MaxAmount.MinorUnits {
				r.failf(ReasonAmountInvalid, "total_limit %d is below max_amount %d", m.MinorUnits, g.MaxAmount.MinorUnits)
			}
		}
		if r.err == nil && !g.ValidUntil.IsZero() && !g.ValidUntil.After(g.ValidFrom) {
			r.failf(ReasonTimestampInvalid, "valid_until must be after valid_from")
		}
		cmd.Grant = g
	case CmdRevoke:
		cmd.Revoke = &Revoke{Reason: r.text("reason", false)}
	case CmdPropose:
		cmd.Propose = &Propose{
			Operation:      r.pattern("operation", true, operationGrammar),
			Amount:         r.money("amount", true),
			Target:         r.id("target", true),
			BasedOnVersion: r.integer("based_on_version", false, 1, MaxMandateVersion, ReasonFieldInvalid),
			Deadline:       r.timestamp("deadline", false),
			Intent:         r.intent("intent"),
			ForkOf:         r.id("fork_of", false),
		}
		if r.err != nil && r.err.Reason == ReasonTimestampInvalid && r.err.field == "deadline" {
			r.err.Reason = ReasonDeadlineInvalid
		}
		if r.err == nil && cmd.Propose.ForkOf != "" && cmd.Propose.Intent == nil {
			r.failField("intent", ReasonMissingField, "missing_field:intent (fork_of names an authorization of an intent)")
		}
	case CmdBegin:
		b := &Begin{AuthorizationID: r.id("authorization_id", true), Executor: r.id("executor", false)}
		if b.Executor == "" {
			b.Executor = cmd.IdempotencyKey // v1 compatibility (deprecated)
		}
		if r.err == nil && b.Executor == "" {
			r.failField("executor", ReasonMissingField, "missing_field:executor (or, deprecated, idempotency_key) names this execution attempt")
		}
		cmd.Begin = b
	case CmdCommit:
		cmd.Commit = &Commit{AuthorizationID: r.id("authorization_id", true), ExternalRef: r.pattern("external_ref", true, externalRefGrammar),
			ExecutionToken: r.token(), Result: r.result("result")}
	case CmdCancel:
		cmd.Cancel = &Cancel{AuthorizationID: r.id("authorization_id", true), Reason: r.text("reason", false),
			NotExecutedProof: r.text("not_executed_proof", false), ExecutionToken: r.token()}
	case CmdReportUnknown:
		cmd.Report = &ReportUnknown{AuthorizationID: r.id("authorization_id", true), Detail: r.text("detail", false),
			ExecutionToken: r.token()}
	case CmdResolve:
		res := &Resolve{AuthorizationID: r.id("authorization_id", true), ExternalRef: r.pattern("external_ref", false, externalRefGrammar),
			Evidence: r.text("evidence", false), ExecutionToken: r.token(), Result: r.result("result"),
			Reconciler: r.id("reconciler", false)}
		switch o := r.str("outcome", true); ResolveOutcome(o) {
		case ResolveCommitted:
			res.Outcome = ResolveCommitted
			if r.err == nil && res.ExternalRef == "" {
				r.failf(ReasonMissingField, "missing_field:external_ref (required to resolve as committed)")
			}
		case ResolveCancelled:
			res.Outcome = ResolveCancelled
			if v, given := r.obj["result"]; given && v != nil && r.err == nil {
				r.failField("result", ReasonFieldInvalid, "field_invalid:result is the committed effect's; a resolve as cancelled carries none")
			}
		default:
			if r.err == nil {
				r.failf(ReasonFieldInvalid, "field_invalid:outcome must be \"committed\" or \"cancelled\"")
			}
		}
		cmd.Resolve = res
	case CmdRecord:
		rec := &Record{Operation: r.pattern("operation", true, operationGrammar), Target: r.id("target", false)}
		if in := r.intent("intent"); in != nil {
			rec.Intent = *in
		} else if r.err == nil {
			r.failField("intent", ReasonMissingField, "missing_field:intent (a record is kept under the intent of the read)")
		}
		rec.Result = r.result("result")
		cmd.Record = rec
	}
	if r.err == nil {
		cmd.Signature, cmd.SignedMessage, r.err = readSignature(obj)
	}
	if r.err == nil && cmd.Grant != nil && cmd.Signature != nil {
		// A signed grant always binds to a mandate version: without
		// based_on_version it may only create the mandate.
		cmd.Grant.BindsVersion = true
	}
	if r.err != nil {
		return fail(r.err.Reason, "%s", r.err.Detail)
	}
	return cmd, nil
}

func unknownKeys(obj object, allowed ...[]string) []string {
	var unknown []string
	for k := range obj {
		found := false
		for _, set := range allowed {
			for _, a := range set {
				if k == a {
					found = true
				}
			}
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return unknown
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// fieldError remembers the first problem a reader found.
type fieldError struct {
	Reason Reason
	Detail string
	field  string
}

// reader extracts typed fields from a parsed object and keeps the first
// error, so each command's decoding reads as a list of fields.
type reader struct {
	obj object
	err *fieldError
}

func (r *reader) failf(reason Reason, format string, args ...any) {
	if r.err == nil {
		r.err = &fieldError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
}

func (r *reader) failField(field string, reason Reason, format string, args ...any) {
	if r.err == nil {
		r.err = &fieldError{Reason: reason, Detail: fmt.Sprintf(format, args...), field: field}
	}
}

// get returns a field's value; a missing or null required field fails.
func (r *reader) get(obj object, field string, required bool) (any, bool) {
	v, ok := obj[field]
	if !ok || v == nil {
		if required {
			r.failField(field, ReasonMissingField, "missing_field:%s", field)
		}
		return nil, false
	}
	return v, true
}

func (r *reader) str(field string, required bool) string {
	v, ok := r.get(r.obj, field, required)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s must be a string", field)
		return ""
	}
	return s
}

func (r *reader) id(field string, required bool) string {
	s := r.str(field, required)
	if s != "" && !partitioner.ValidID(s) {
		r.failField(field, ReasonIDInvalid, "%s %q is outside the id grammar [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", field, truncate(s, 160))
		return ""
	}
	if required && s == "" {
		r.failField(field, ReasonMissingField, "missing_field:%s", field)
	}
	return s
}

func (r *reader) pattern(field string, required bool, g grammar) string {
	s := r.str(field, required)
	if s != "" && !g.ok(s) {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s %q does not match %s", field, truncate(s, 160), g.text)
		return ""
	}
	if required && s == "" {
		r.failField(field, ReasonMissingField, "missing_field:%s", field)
	}
	return s
}

func (r *reader) text(field string, required bool) string {
	s := r.str(field, required)
	if len(s) > MaxTextBytes {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s is %d bytes; the limit is %d", field, len(s), MaxTextBytes)
		return ""
	}
	return s
}

func (r *reader) boolean(field string, def bool) bool {
	v, ok := r.get(r.obj, field, false)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s must be true or false", field)
		return def
	}
	return b
}

// parseInteger accepts only a JSON integer literal: no fraction, no
// exponent, no string, no -0, and it must fit in int64.
func parseInteger(v any) (int64, string) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, "must be a JSON integer, not a string or other type"
	}
	s := n.String()
	if !isJSONInteger(s) {
		return 0, fmt.Sprintf("%s is not an integer (no fractions or exponents)", truncate(s, 40))
	}
	if s == "-0" {
		return 0, "-0 is not allowed"
	}
	i, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Sprintf("%s overflows a 64-bit integer", truncate(s, 40))
	}
	return i, ""
}

func (r *reader) integer(field string, required bool, lo, hi int64, reason Reason) int64 {
	v, ok := r.get(r.obj, field, required)
	if !ok {
		return 0
	}
	i, problem := parseInteger(v)
	if problem == "" && (i < lo || i > hi) {
		problem = fmt.Sprintf("%d is outside [%d, %d]", i, lo, hi)
	}
	if problem != "" {
		r.failField(field, reason, "%s:%s %s", reason, field, problem)
		return 0
	}
	return i
}

// MaxMandateVersion bounds a based_on_version.
const MaxMandateVersion = int64(1) << 62

// MaxExecutionToken bounds an execution token (a per-mandate counter).
const MaxExecutionToken = int64(1) << 62

// token reads the optional execution_token: an integer > 0.
func (r *reader) token() int64 {
	return r.integer("execution_token", false, 1, MaxExecutionToken, ReasonFieldInvalid)
}

// result reads an optional JSON object and re-encodes it compactly with
// sorted keys (the strict parser already refused what no field may hold:
// invalid UTF-8, NUL and control characters, duplicate keys, deep nesting).
func (r *reader) result(field string) json.RawMessage {
	v, ok := r.get(r.obj, field, false)
	if !ok {
		return nil
	}
	obj, isObj := v.(object)
	if !isObj {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s must be a JSON object", field)
		return nil
	}
	b, err := json.Marshal(obj)
	if err != nil {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s cannot be encoded: %v", field, err)
		return nil
	}
	if len(b) > MaxResultBytes {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s is %d bytes encoded; the limit is %d", field, len(b), MaxResultBytes)
		return nil
	}
	return b
}

func (r *reader) seconds(field string, def, max time.Duration) time.Duration {
	if _, ok := r.obj[field]; !ok {
		return def
	}
	s := r.integer(field, false, 1, int64(max/time.Second), ReasonFieldInvalid)
	if s == 0 {
		return def
	}
	return time.Duration(s) * time.Second
}

func (r *reader) money(field string, required bool) Money {
	v, ok := r.get(r.obj, field, required)
	if !ok {
		return Money{}
	}
	m, isObj := v.(object)
	if !isObj {
		r.failField(field, ReasonAmountInvalid, "amount_invalid:%s must be an object {\"minor_units\": <integer>, \"currency\": \"<ISO 4217>\"}", field)
		return Money{}
	}
	if unknown := unknownKeys(m, moneyFields); len(unknown) > 0 {
		r.failField(field, ReasonUnknownField, "unknown field(s) %q in %s", unknown, field)
		return Money{}
	}
	units, present := m["minor_units"]
	if !present || units == nil {
		r.failField(field, ReasonMissingField, "missing_field:%s.minor_units", field)
		return Money{}
	}
	i, problem := parseInteger(units)
	if problem == "" && (i <= 0 || i > MaxMinorUnits) {
		problem = fmt.Sprintf("%d is outside (0, %d]", i, MaxMinorUnits)
	}
	if problem != "" {
		r.failField(field, ReasonAmountInvalid, "amount_invalid:%s.minor_units %s", field, problem)
		return Money{}
	}
	cur, isStr := m["currency"].(string)
	if _, present := m["currency"]; !present {
		r.failField(field, ReasonMissingField, "missing_field:%s.currency", field)
		return Money{}
	}
	if !isStr || !ValidCurrency(cur) {
		r.failField(field, ReasonCurrencyInvalid, "%s.currency %v is not an active ISO 4217 code", field, m["currency"])
		return Money{}
	}
	return Money{MinorUnits: i, Currency: cur}
}

// intent reads an optional {"run_id", "step", "action"} object of ids.
func (r *reader) intent(field string) *Intent {
	v, ok := r.get(r.obj, field, false)
	if !ok {
		return nil
	}
	m, isObj := v.(object)
	if !isObj {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s must be an object {\"run_id\", \"step\", \"action\"}", field)
		return nil
	}
	if unknown := unknownKeys(m, intentFields); len(unknown) > 0 {
		r.failField(field, ReasonUnknownField, "unknown field(s) %q in %s", unknown, field)
		return nil
	}
	sub := reader{obj: m}
	in := &Intent{RunID: sub.id("run_id", true), Step: sub.id("step", true), Action: sub.id("action", true)}
	if sub.err != nil {
		detail := field + "." + sub.err.Detail
		if rest, ok := strings.CutPrefix(sub.err.Detail, "missing_field:"); ok {
			detail = "missing_field:" + field + "." + rest
		}
		r.failField(field, sub.err.Reason, "%s", detail)
		return nil
	}
	return in
}

// stringList reads an array of strings of a grammar (nil: the id grammar).
func (r *reader) stringList(field string, min, max int, g *grammar) []string {
	v, ok := r.get(r.obj, field, min > 0)
	if !ok {
		return nil
	}
	arr, isArr := v.([]any)
	if !isArr {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s must be an array of strings", field)
		return nil
	}
	if len(arr) < min || len(arr) > max {
		r.failField(field, ReasonFieldInvalid, "field_invalid:%s has %d entries; allowed %d to %d", field, len(arr), min, max)
		return nil
	}
	out := make([]string, 0, len(arr))
	seen := map[string]bool{}
	for _, e := range arr {
		s, isStr := e.(string)
		valid := isStr && (g == nil && partitioner.ValidID(s) || g != nil && g.ok(s))
		if !valid {
			r.failField(field, ReasonIDInvalid, "%s entry %v is outside its grammar", field, e)
			return nil
		}
		if seen[s] {
			r.failField(field, ReasonAmbiguousField, "%s lists %q twice", field, s)
			return nil
		}
		seen[s] = true
		out = append(out, s)
	}
	return out
}

// timestamp parses RFC 3339 with an explicit offset. Leap seconds, missing
// zones, epoch numbers and years outside 2000–2199 are refused.
func (r *reader) timestamp(field string, required bool) time.Time {
	v, ok := r.get(r.obj, field, required)
	if !ok {
		return time.Time{}
	}
	s, isStr := v.(string)
	if !isStr {
		r.failField(field, ReasonTimestampInvalid, "%s must be an RFC 3339 string such as 2026-11-30T08:00:00Z", field)
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !isRFC3339(s) || t.UTC().Year() < 2000 || t.UTC().Year() > 2199 {
		r.failField(field, ReasonTimestampInvalid, "%s %q is not an RFC 3339 timestamp with a zone between 2000 and 2199", field, truncate(s, 64))
		return time.Time{}
	}
	return t.UTC()
}
