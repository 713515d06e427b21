package wire

import (
	"encoding/json"
	"time"

	"github.com/mandated/mandated/partitioner"
)

// SchemaVersion is the only wire version this build speaks.
const SchemaVersion = 1

// CommandType names a command. Grant and revoke come from grantors on the
// grants topic; the rest from agents and platforms on the proposals topic.
type CommandType string

const (
	CmdGrant         CommandType = "grant"
	CmdRevoke        CommandType = "revoke"
	CmdPropose       CommandType = "propose"
	CmdBegin         CommandType = "begin"
	CmdCommit        CommandType = "commit"
	CmdCancel        CommandType = "cancel"
	CmdReportUnknown CommandType = "report_unknown"
	CmdResolve       CommandType = "resolve"
	// CmdRecord records a read-only tool's result under its intent (seed
	// 003's recorded reads): the first result is kept and every later
	// record of the intent is answered with it. It takes no authority.
	CmdRecord CommandType = "record"
)

// IsGrantorCommand reports whether t may only arrive on the grants topic,
// the privileged control plane: grant and revoke (grantors) and resolve
// (the reconciler).
func (t CommandType) IsGrantorCommand() bool {
	return t == CmdGrant || t == CmdRevoke || t == CmdResolve
}

// Known reports whether t is a command of this schema version.
func (t CommandType) Known() bool {
	switch t {
	case CmdGrant, CmdRevoke, CmdPropose, CmdBegin, CmdCommit, CmdCancel, CmdReportUnknown, CmdResolve, CmdRecord:
		return true
	}
	return false
}

// Money is an amount in integer minor units of an ISO 4217 currency
// (15000 EUR minor units is 150.00 EUR).
type Money struct {
	MinorUnits int64  `json:"minor_units"`
	Currency   string `json:"currency"`
}

// Command is one decoded, validated command. Exactly one of the typed
// bodies is set, matching Type.
type Command struct {
	Type           CommandType
	Key            partitioner.MandateKey
	IdempotencyKey string    // required for propose; optional elsewhere
	SentAt         time.Time // the producer's clock, for latency only; zero when absent

	// Signature is a grantor command's signature, nil when it carries none;
	// SignedMessage is what it signs (SigningMessage of the record value).
	Signature     *Signature
	SignedMessage []byte

	Grant   *Grant
	Revoke  *Revoke
	Propose *Propose
	Begin   *Begin
	Commit  *Commit
	Cancel  *Cancel
	Report  *ReportUnknown
	Resolve *Resolve
	Record  *Record
}

// Grant creates a mandate or replaces the terms of an active one.
type Grant struct {
	Uses             int64    // uses allowed in total, ≥ 1
	MaxAmount        Money    // cap per use
	TotalLimit       *Money   // optional cap on the sum of held and spent amounts
	Operations       []string // operations the mandate covers, ≥ 1
	Targets          []string // allowed targets; empty means any target
	ValidFrom        time.Time
	ValidUntil       time.Time // zero means no end
	ReleaseOnCancel  bool      // a cancelled authorization gives its use back
	HoldWindow       time.Duration
	ExecutionTimeout time.Duration

	// BasedOnVersion is the mandate version the grantor read before it
	// wrote these terms: 0 when the grant creates the mandate. It binds the
	// grant (BindsVersion) when it is signed — absent, it is 0 — or when an
	// unsigned grant carries it: the grant is then refused stale_grant
	// unless the mandate's terms are still those the grantor saw, so a
	// captured older grant replayed later cannot restore wider terms.
	// Neither is a term of the mandate, so neither is in the idempotency
	// fingerprint (a retry under the same key is the same intent).
	BasedOnVersion int64 `json:"-"`
	BindsVersion   bool  `json:"-"`
}

// Revoke ends a mandate's unused authority.
type Revoke struct {
	Reason string
}

// Propose asks for one use of a mandate.
type Propose struct {
	Operation      string
	Amount         Money
	Target         string
	BasedOnVersion int64     // 0 when the agent did not name one
	Deadline       time.Time // requested reservation deadline; zero means the mandate's hold window
	// Intent names the step of a workflow this proposal acts for, from the
	// orchestrator's stable facts; nil when the agent named none.
	Intent *Intent
	// ForkOf names the authorization of Intent this proposal knowingly
	// supersedes (which must be terminal); empty when it is not a fork.
	ForkOf string
}

// Intent identifies one action of one workflow run: the same intent
// proposed again on the same mandate (an agent restored from a checkpoint,
// under a regenerated idempotency key) is a replay, not a new use; on
// another mandate it is another action. Each part is an id.
type Intent struct {
	RunID  string `json:"run_id"`
	Step   string `json:"step"`
	Action string `json:"action"`
}

// Begin is the compare-and-set gate before the external call: it elects
// one executor attempt per authorization.
type Begin struct {
	AuthorizationID string
	// Executor names this execution attempt (a worker instance plus an
	// attempt nonce): the same executor again is a replay, any other one a
	// loser. Taken from the idempotency key when the field is absent (v1
	// compatibility, deprecated).
	Executor string
}

// MaxResultBytes bounds a commit's result as re-encoded.
const MaxResultBytes = 8 << 10

// Commit records that the external call happened.
type Commit struct {
	AuthorizationID string
	ExternalRef     string
	// ExecutionToken is the token of the begin this commit follows; 0 when
	// absent (a commit straight from reserved).
	ExecutionToken int64
	// Result is the provider's answer, a JSON object re-encoded compactly
	// with sorted keys (at most MaxResultBytes); nil when absent.
	Result json.RawMessage
}

// Cancel gives up an authorization; from executing only with proof that
// the external call did not happen (and the execution token).
type Cancel struct {
	AuthorizationID  string
	Reason           string
	NotExecutedProof string
	ExecutionToken   int64
}

// ReportUnknown says the external call's outcome is unknown.
type ReportUnknown struct {
	AuthorizationID string
	Detail          string
	ExecutionToken  int64
}

// ResolveOutcome is what reconciliation with the provider found.
type ResolveOutcome string

const (
	ResolveCommitted ResolveOutcome = "committed"
	ResolveCancelled ResolveOutcome = "cancelled"
)

// Resolve settles an in-doubt authorization.
type Resolve struct {
	AuthorizationID string
	Outcome         ResolveOutcome
	ExternalRef     string
	Evidence        string
	ExecutionToken  int64 // optional: when given, it must be the in-doubt execution's
	// Result is the provider's answer the reconciliation found (as a
	// commit's: a JSON object re-encoded compactly with sorted keys, at
	// most MaxResultBytes); only with outcome committed, nil when absent.
	// It becomes the authorization's recorded result, so the losers of a
	// reconciled execution see one.
	Result json.RawMessage
	// Reconciler names who resolved it (an id: "console:ot_...",
	// "mandatectl:alice"); recorded with the authorization. Empty when
	// the reconciler named none.
	Reconciler string
}

// Record records what a read-only tool returned for one intent, or, with
// no Result, looks up what was recorded: a restored or resumed agent sees
// the first answer again instead of fetching a new one. A record takes no
// use, holds no amount and never blocks a proposal (its intent is scoped
// apart from every proposal's: see lifecycle.RecordScopePrefix).
type Record struct {
	Operation string // the read (operation grammar)
	Target    string // what was read (an id), "" when not named
	Intent    Intent // required
	// Result is the read's answer, a JSON object re-encoded as a commit's
	// (compact, sorted keys, at most MaxResultBytes); nil: a look-up.
	Result json.RawMessage
}

// AuthorizationID returns the authorization a command addresses, if any.
func (c *Command) AuthorizationID() string {
	switch {
	case c.Begin != nil:
		return c.Begin.AuthorizationID
	case c.Commit != nil:
		return c.Commit.AuthorizationID
	case c.Cancel != nil:
		return c.Cancel.AuthorizationID
	case c.Report != nil:
		return c.Report.AuthorizationID
	case c.Resolve != nil:
		return c.Resolve.AuthorizationID
	}
	return ""
}

// ExecutionToken returns the execution token a command carries (0: none).
func (c *Command) ExecutionToken() int64 {
	switch {
	case c.Commit != nil:
		return c.Commit.ExecutionToken
	case c.Cancel != nil:
		return c.Cancel.ExecutionToken
	case c.Report != nil:
		return c.Report.ExecutionToken
	case c.Resolve != nil:
		return c.Resolve.ExecutionToken
	}
	return 0
}
