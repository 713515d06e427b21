package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Command is a command the client can send: one of the typed requests below,
// or RawCommand for JSON built elsewhere (the HTTP gateway's).
type Command interface {
	// fields returns the command's JSON object without "v" and "sent_at".
	fields() (map[string]any, error)
}

// Ref names a mandate: the Kafka key of every command about it.
type Ref struct {
	Org       string
	MandateID string
}

func (r Ref) put(m map[string]any, typ wire.CommandType) map[string]any {
	m["type"] = string(typ)
	m["org"] = r.Org
	m["mandate_id"] = r.MandateID
	return m
}

// AuthorizationRef names one authorization of a mandate.
type AuthorizationRef struct {
	Org             string
	MandateID       string
	AuthorizationID string
	// Differs is what the decision the ref was taken from (RefOf) said
	// differs between the request and the recorded authorization it
	// replayed (wire.Decision.Differs): Execute refuses such a ref with a
	// *ReplayDiffersError unless the caller accepts those fields
	// (AcceptDiffers). It is not part of any command.
	Differs []string
}

// RefOf returns the authorization a decision is about, with what the
// decision said differs (a replay of an intent whose terms were not this
// request's).
func RefOf(d *Decision) AuthorizationRef {
	return AuthorizationRef{Org: d.Org, MandateID: d.MandateID, AuthorizationID: d.AuthorizationID, Differs: slices.Clone(d.Differs)}
}

func (a AuthorizationRef) put(m map[string]any, typ wire.CommandType) map[string]any {
	Ref{Org: a.Org, MandateID: a.MandateID}.put(m, typ)
	m["authorization_id"] = a.AuthorizationID
	return m
}

// Each typed command names its wire members in `wire` tags: "name" is
// written always, "name,omitempty" only when set (not zero, not a nil
// pointer, not an empty list or result). members writes them after the
// mandate (and authorization) the command's Ref names: a time in UTC as
// RFC 3339 with nanoseconds, a pointer as what it points to, anything else
// as it is (a Money as its JSON object, a result as its raw JSON).
func members(m map[string]any, cmd any) map[string]any {
	v := reflect.ValueOf(cmd)
	for i := range v.NumField() {
		tag, ok := v.Type().Field(i).Tag.Lookup("wire")
		if !ok {
			continue // the embedded Ref: put wrote it
		}
		name, omitEmpty := strings.CutSuffix(tag, ",omitempty")
		fv := v.Field(i)
		if omitEmpty && isEmpty(fv) {
			continue
		}
		if fv.Kind() == reflect.Pointer {
			fv = fv.Elem()
		}
		if t, ok := fv.Interface().(time.Time); ok {
			m[name] = t.UTC().Format(time.RFC3339Nano)
			continue
		}
		m[name] = fv.Interface()
	}
	return m
}

func isEmpty(v reflect.Value) bool {
	if t, ok := v.Interface().(time.Time); ok {
		return t.IsZero()
	}
	if v.Kind() == reflect.Slice {
		return v.Len() == 0
	}
	return v.IsZero()
}

// Propose asks for one use of a mandate.
type Propose struct {
	Ref
	// IdempotencyKey names the business intent, the same on every retry:
	// IntentKey(run, step, action), never a call-time UUID. Required. Its
	// scope is the mandate (and the operation): the same key on another
	// mandate is another intent, decided on its own.
	IdempotencyKey string     `wire:"idempotency_key"`
	Operation      string     `wire:"operation"`
	Amount         wire.Money `wire:"amount"`
	Target         string     `wire:"target"`
	BasedOnVersion int64      `wire:"based_on_version,omitempty"` // optional
	Deadline       time.Time  `wire:"deadline,omitempty"`         // optional
	// Intent names the workflow step this proposal acts for (optional):
	// the same intent again is answered by its recorded authorization,
	// whatever the key (docs/design.md, "Restored agents").
	Intent *wire.Intent `wire:"intent,omitempty"`
	// ForkOf names the terminal authorization of Intent this proposal
	// knowingly supersedes (optional; needs Intent).
	ForkOf string `wire:"fork_of,omitempty"`
}

func (p Propose) fields() (map[string]any, error) {
	return members(p.put(map[string]any{}, wire.CmdPropose), p), nil
}

// Begin claims the execution of a reserved authorization for one executor
// attempt. Executor names this attempt; Execute picks a unique one.
type Begin struct {
	AuthorizationRef
	Executor string `wire:"executor,omitempty"`
}

func (b Begin) fields() (map[string]any, error) {
	return members(b.put(map[string]any{}, wire.CmdBegin), b), nil
}

// Commit records that the external call happened.
type Commit struct {
	AuthorizationRef
	ExternalRef    string          `wire:"external_ref"`
	ExecutionToken int64           `wire:"execution_token,omitempty"` // the begin's token, when the server hands one out
	Result         json.RawMessage `wire:"result,omitempty"`          // a JSON object recorded with the commit, when the server supports it
	IdempotencyKey string          `wire:"idempotency_key,omitempty"` // optional
}

func (c Commit) fields() (map[string]any, error) {
	return members(c.put(map[string]any{}, wire.CmdCommit), c), nil
}

// Cancel gives an authorization up; from executing only with proof that
// the external call did not happen.
type Cancel struct {
	AuthorizationRef
	Reason           string `wire:"reason,omitempty"`
	NotExecutedProof string `wire:"not_executed_proof,omitempty"`
	ExecutionToken   int64  `wire:"execution_token,omitempty"`
	IdempotencyKey   string `wire:"idempotency_key,omitempty"`
}

func (c Cancel) fields() (map[string]any, error) {
	return members(c.put(map[string]any{}, wire.CmdCancel), c), nil
}

// ReportUnknown says the external call's outcome is unknown: the use stays
// held until a reconciler resolves it.
type ReportUnknown struct {
	AuthorizationRef
	Detail         string `wire:"detail,omitempty"`
	ExecutionToken int64  `wire:"execution_token,omitempty"`
	IdempotencyKey string `wire:"idempotency_key,omitempty"`
}

func (r ReportUnknown) fields() (map[string]any, error) {
	return members(r.put(map[string]any{}, wire.CmdReportUnknown), r), nil
}

// Resolve settles an in-doubt authorization (the reconciler's command).
type Resolve struct {
	AuthorizationRef
	Outcome        wire.ResolveOutcome `wire:"outcome"`
	ExternalRef    string              `wire:"external_ref,omitempty"`
	Evidence       string              `wire:"evidence,omitempty"`
	ExecutionToken int64               `wire:"execution_token,omitempty"`
	IdempotencyKey string              `wire:"idempotency_key,omitempty"`
	// Result is the provider's answer the reconciliation found (a JSON
	// object), only with outcome committed: it becomes the authorization's
	// recorded result, which the losers of the execution are shown.
	Result json.RawMessage `wire:"result,omitempty"`
	// Reconciler names who resolves it (an id such as "console:ot_..." or
	// "mandatectl:alice"): the authorization keeps it as resolved_by.
	Reconciler string `wire:"reconciler,omitempty"`
}

func (r Resolve) fields() (map[string]any, error) {
	return members(r.put(map[string]any{}, wire.CmdResolve), r), nil
}

// RecordRead records what a read-only tool returned for one intent (a
// recorded read: docs/wire.md, "Recorded reads"), or, without Result, looks
// up what was recorded. The first result recorded for the intent is the
// answer to every later RecordRead of it. Client.Read runs the look-up,
// the read and the record in one call. (The package function Record is
// something else: it builds any command's record for SubmitExact.)
type RecordRead struct {
	Ref
	Operation string      `wire:"operation"` // the read (operation grammar): price.lookup
	Intent    wire.Intent `wire:"intent"`    // the workflow step, as a proposal's; required
	// Target names what was read, as an id (a digest of the read's
	// arguments): a later record of the intent with another target is
	// answered with the first result and differs ["target"]. Optional.
	Target string `wire:"target,omitempty"`
	// Result is the read's answer, a JSON object of at most 8 KiB; nil: a
	// look-up.
	Result         json.RawMessage `wire:"result,omitempty"`
	IdempotencyKey string          `wire:"idempotency_key,omitempty"` // optional, echoed, never bound
}

func (r RecordRead) fields() (map[string]any, error) {
	return members(r.put(map[string]any{}, wire.CmdRecord), r), nil
}

// Grant creates a mandate or replaces its terms (the grantor's command).
type Grant struct {
	Ref
	Uses                    int64       `wire:"uses"`
	MaxAmount               wire.Money  `wire:"max_amount"`
	Operations              []string    `wire:"operations"`
	TotalLimit              *wire.Money `wire:"total_limit,omitempty"`
	Targets                 []string    `wire:"targets,omitempty"`
	ValidFrom               time.Time   `wire:"valid_from,omitempty"`
	ValidUntil              time.Time   `wire:"valid_until,omitempty"`
	ReleaseOnCancel         *bool       `wire:"release_on_cancel,omitempty"`
	HoldSeconds             int64       `wire:"hold_seconds,omitempty"`
	ExecutionTimeoutSeconds int64       `wire:"execution_timeout_seconds,omitempty"`
	IdempotencyKey          string      `wire:"idempotency_key,omitempty"`
	// BasedOnVersion, when set, is the mandate version these terms replace
	// (0: the grant creates the mandate): the grant is refused stale_grant
	// if the terms changed since. A signed grant always carries one.
	BasedOnVersion *int64 `wire:"based_on_version,omitempty"`
}

func (g Grant) fields() (map[string]any, error) {
	return members(g.put(map[string]any{}, wire.CmdGrant), g), nil
}

// Revoke ends a mandate's unused authority (the grantor's command).
type Revoke struct {
	Ref
	Reason         string `wire:"reason,omitempty"`
	IdempotencyKey string `wire:"idempotency_key,omitempty"`
}

func (r Revoke) fields() (map[string]any, error) {
	return members(r.put(map[string]any{}, wire.CmdRevoke), r), nil
}

// RawCommand is a command as a JSON object, for callers that build the
// wire JSON themselves. It is validated like every other command.
type RawCommand json.RawMessage

func (r RawCommand) fields() (map[string]any, error) {
	var m map[string]any
	d := json.NewDecoder(bytesReader(r))
	d.UseNumber()
	if err := d.Decode(&m); err != nil || m == nil {
		return nil, &InvalidCommandError{Reason: wire.ReasonMalformedJSON, Detail: "the command is not a JSON object"}
	}
	return m, nil
}

// InvalidCommandError is a command the processor would reject: the client
// returns it and produces nothing.
type InvalidCommandError struct {
	Reason wire.Reason
	Detail string
}

func (e *InvalidCommandError) Error() string {
	return fmt.Sprintf("client: invalid command (%s): %s", e.Reason, e.Detail)
}

// ErrInvalidCommand is wrapped by every InvalidCommandError.
var ErrInvalidCommand = errors.New("client: invalid command")

func (e *InvalidCommandError) Unwrap() error { return ErrInvalidCommand }

// MandateKey returns the Kafka record key of a mandate, validated against
// the id grammar.
func MandateKey(org, mandateID string) (partitioner.MandateKey, error) {
	return partitioner.NewMandateKey(org, mandateID)
}

// IntentKey derives the idempotency key of one business intent from stable
// workflow facts (see wire.IntentKey for the documented hash).
func IntentKey(runID, step, action string) string { return wire.IntentKey(runID, step, action) }
