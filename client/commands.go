package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor/wire"
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
}

// RefOf returns the authorization a decision is about.
func RefOf(d *Decision) AuthorizationRef {
	return AuthorizationRef{Org: d.Org, MandateID: d.MandateID, AuthorizationID: d.AuthorizationID}
}

func (a AuthorizationRef) put(m map[string]any, typ wire.CommandType) map[string]any {
	Ref{Org: a.Org, MandateID: a.MandateID}.put(m, typ)
	m["authorization_id"] = a.AuthorizationID
	return m
}

func putIf[T comparable](m map[string]any, name string, v T) {
	var zero T
	if v != zero {
		m[name] = v
	}
}

func putTime(m map[string]any, name string, t time.Time) {
	if !t.IsZero() {
		m[name] = t.UTC().Format(time.RFC3339Nano)
	}
}

// Propose asks for one use of a mandate.
type Propose struct {
	Ref
	// IdempotencyKey names the business intent, the same on every retry:
	// IntentKey(run, step, action), never a call-time UUID. Required. Its
	// scope is the mandate (and the operation): the same key on another
	// mandate is another intent, decided on its own.
	IdempotencyKey string
	Operation      string
	Amount         wire.Money
	Target         string
	BasedOnVersion int64     // optional
	Deadline       time.Time // optional
}

func (p Propose) fields() (map[string]any, error) {
	m := p.put(map[string]any{}, wire.CmdPropose)
	m["idempotency_key"] = p.IdempotencyKey
	m["operation"] = p.Operation
	m["amount"] = p.Amount
	m["target"] = p.Target
	putIf(m, "based_on_version", p.BasedOnVersion)
	putTime(m, "deadline", p.Deadline)
	return m, nil
}

// Begin claims the execution of a reserved authorization for one executor
// attempt. Executor names this attempt; Execute picks a unique one.
type Begin struct {
	AuthorizationRef
	Executor string
}

func (b Begin) fields() (map[string]any, error) {
	m := b.put(map[string]any{}, wire.CmdBegin)
	putIf(m, "executor", b.Executor)
	return m, nil
}

// Commit records that the external call happened.
type Commit struct {
	AuthorizationRef
	ExternalRef    string
	ExecutionToken int64           // the begin's token, when the server hands one out
	Result         json.RawMessage // a JSON object recorded with the commit, when the server supports it
	IdempotencyKey string          // optional
}

func (c Commit) fields() (map[string]any, error) {
	m := c.put(map[string]any{}, wire.CmdCommit)
	m["external_ref"] = c.ExternalRef
	putIf(m, "execution_token", c.ExecutionToken)
	if len(c.Result) > 0 {
		m["result"] = c.Result
	}
	putIf(m, "idempotency_key", c.IdempotencyKey)
	return m, nil
}

// Cancel gives an authorization up; from executing only with proof that
// the external call did not happen.
type Cancel struct {
	AuthorizationRef
	Reason           string
	NotExecutedProof string
	ExecutionToken   int64
	IdempotencyKey   string
}

func (c Cancel) fields() (map[string]any, error) {
	m := c.put(map[string]any{}, wire.CmdCancel)
	putIf(m, "reason", c.Reason)
	putIf(m, "not_executed_proof", c.NotExecutedProof)
	putIf(m, "execution_token", c.ExecutionToken)
	putIf(m, "idempotency_key", c.IdempotencyKey)
	return m, nil
}

// ReportUnknown says the external call's outcome is unknown: the use stays
// held until a reconciler resolves it.
type ReportUnknown struct {
	AuthorizationRef
	Detail         string
	ExecutionToken int64
	IdempotencyKey string
}

func (r ReportUnknown) fields() (map[string]any, error) {
	m := r.put(map[string]any{}, wire.CmdReportUnknown)
	putIf(m, "detail", r.Detail)
	putIf(m, "execution_token", r.ExecutionToken)
	putIf(m, "idempotency_key", r.IdempotencyKey)
	return m, nil
}

// Resolve settles an in-doubt authorization (the reconciler's command).
type Resolve struct {
	AuthorizationRef
	Outcome        wire.ResolveOutcome
	ExternalRef    string
	Evidence       string
	ExecutionToken int64
	IdempotencyKey string
}

func (r Resolve) fields() (map[string]any, error) {
	m := r.put(map[string]any{}, wire.CmdResolve)
	m["outcome"] = string(r.Outcome)
	putIf(m, "external_ref", r.ExternalRef)
	putIf(m, "evidence", r.Evidence)
	putIf(m, "execution_token", r.ExecutionToken)
	putIf(m, "idempotency_key", r.IdempotencyKey)
	return m, nil
}

// Grant creates a mandate or replaces its terms (the grantor's command).
type Grant struct {
	Ref
	Uses                    int64
	MaxAmount               wire.Money
	Operations              []string
	TotalLimit              *wire.Money
	Targets                 []string
	ValidFrom               time.Time
	ValidUntil              time.Time
	ReleaseOnCancel         *bool
	HoldSeconds             int64
	ExecutionTimeoutSeconds int64
	IdempotencyKey          string
}

func (g Grant) fields() (map[string]any, error) {
	m := g.put(map[string]any{}, wire.CmdGrant)
	m["uses"] = g.Uses
	m["max_amount"] = g.MaxAmount
	m["operations"] = g.Operations
	if g.TotalLimit != nil {
		m["total_limit"] = *g.TotalLimit
	}
	if len(g.Targets) > 0 {
		m["targets"] = g.Targets
	}
	putTime(m, "valid_from", g.ValidFrom)
	putTime(m, "valid_until", g.ValidUntil)
	if g.ReleaseOnCancel != nil {
		m["release_on_cancel"] = *g.ReleaseOnCancel
	}
	putIf(m, "hold_seconds", g.HoldSeconds)
	putIf(m, "execution_timeout_seconds", g.ExecutionTimeoutSeconds)
	putIf(m, "idempotency_key", g.IdempotencyKey)
	return m, nil
}

// Revoke ends a mandate's unused authority (the grantor's command).
type Revoke struct {
	Ref
	Reason         string
	IdempotencyKey string
}

func (r Revoke) fields() (map[string]any, error) {
	m := r.put(map[string]any{}, wire.CmdRevoke)
	putIf(m, "reason", r.Reason)
	putIf(m, "idempotency_key", r.IdempotencyKey)
	return m, nil
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
