package wire

import (
	"encoding/json"
	"fmt"
	"time"
)

// Outcome is what a decision says happened.
type Outcome string

const (
	OutcomeGranted     Outcome = "granted"  // a grant created or updated the mandate
	OutcomeRevoked     Outcome = "revoked"  // the mandate (or a reservation of it) was revoked
	OutcomeReserved    Outcome = "reserved" // a use is reserved for this authorization
	OutcomeDenied      Outcome = "denied"   // the mandate does not allow this proposal
	OutcomeReplayed    Outcome = "replayed" // the same intent again: the original answer, current state
	OutcomeConflict    Outcome = "conflict" // the idempotency key was used for a different intent
	OutcomeStale       Outcome = "stale_version"
	OutcomeExecuting   Outcome = "executing"
	OutcomeCommitted   Outcome = "committed"
	OutcomeCancelled   Outcome = "cancelled"
	OutcomeExpired     Outcome = "expired"
	OutcomeInDoubt     Outcome = "in_doubt"
	OutcomeRefused     Outcome = "refused"  // the command does not fit the authorization's current state
	OutcomeRejected    Outcome = "rejected" // the record is not a valid command
	OutcomeRecorded    Outcome = "recorded" // a read's result was recorded under its intent
	CommandTimer               = "timer"    // Decision.Command of a deadline transition
	CommandUndecodable         = "unknown"  // Decision.Command when the type could not be read
)

// AuthState is an authorization's lifecycle state.
type AuthState string

const (
	StateReserved  AuthState = "reserved"
	StateExecuting AuthState = "executing"
	StateCommitted AuthState = "committed"
	StateCancelled AuthState = "cancelled"
	StateExpired   AuthState = "expired"
	StateRevoked   AuthState = "revoked"
	StateInDoubt   AuthState = "in_doubt"
	// StateRecorded is a recorded read: terminal from its creation, it
	// holds the read's result and never held a use.
	StateRecorded AuthState = "recorded"
)

// Terminal reports whether s can never change again.
func (s AuthState) Terminal() bool {
	switch s {
	case StateCommitted, StateCancelled, StateExpired, StateRevoked, StateRecorded:
		return true
	}
	return false
}

// HoldsUse reports whether an authorization in state s holds one of its
// mandate's uses (reserved, executing or in doubt).
func (s AuthState) HoldsUse() bool {
	return s == StateReserved || s == StateExecuting || s == StateInDoubt
}

// MandateStatus is a mandate's status.
type MandateStatus string

const (
	MandateActive  MandateStatus = "active"
	MandateRevoked MandateStatus = "revoked"
)

// Decision is one answer on the decisions topic, schema version 1.
// PossibleReplay is a committed or executing authorization with the same
// operation, amount and target, under another key, within the org's replay
// window (reason possible_replay under policy deny).
type Decision struct {
	V               int                `json:"v"`
	DecisionID      string             `json:"decision_id"` // "<partition>-<sequence>"
	Sequence        int64              `json:"sequence"`    // outbox sequence, gapless per partition
	Partition       int32              `json:"partition"`
	Epoch           int64              `json:"epoch"` // the partition epoch that decided it
	MandateKey      string             `json:"mandate_key"`
	Org             string             `json:"org"`
	MandateID       string             `json:"mandate_id"`
	Command         string             `json:"command"`
	IdempotencyKey  string             `json:"idempotency_key,omitempty"`
	AuthorizationID string             `json:"authorization_id,omitempty"`
	Outcome         Outcome            `json:"outcome"`
	Reason          Reason             `json:"reason,omitempty"`
	Detail          string             `json:"detail,omitempty"`
	ReplayOf        string             `json:"replay_of,omitempty"`        // the decision that first answered this intent
	OriginalOutcome Outcome            `json:"original_outcome,omitempty"` // on a replay: what that first answer was
	ExecutionToken  int64              `json:"execution_token,omitempty"`  // the token of the authorization's execution, once begun
	ForkOf          string             `json:"fork_of,omitempty"`          // on a fork: the authorization it supersedes
	PossibleReplay  string             `json:"possible_replay_of,omitempty"`
	Authorization   *AuthorizationView `json:"authorization,omitempty"`
	HeldBy          *AuthorizationView `json:"held_by,omitempty"` // on a denial: the authorization holding the authority
	Mandate         *MandateView       `json:"mandate,omitempty"`
	HomePartition   *int32             `json:"home_partition,omitempty"` // on a misrouted rejection
	Source          *Source            `json:"source,omitempty"`
	DecidedAt       time.Time          `json:"decided_at"`
	SentAt          *time.Time         `json:"sent_at,omitempty"`   // the command's sent_at, echoed for latency
	SignedBy        string             `json:"signed_by,omitempty"` // the grantor key whose signature was verified
	// Differs, on a replay of an intent, names the terms of this request
	// that differ from the recorded authorization's (sorted: "amount",
	// "currency", "operation", "target"); nil when they are the same.
	// The answer is the recorded authorization's, not this request's.
	Differs []string `json:"differs,omitempty"`
	// Binds is what the decision bound for later commands: an idempotency
	// key, an intent (recovery rebuilds their records from it).
	Binds *Binding `json:"binds,omitempty"`
	// PrevHash and Hash chain the partition's decisions (see chain.go):
	// set by the sink when it writes the outbox row, always the last two
	// members of the published JSON. Fields added to Decision go above.
	PrevHash string `json:"prev_hash,omitempty"`
	Hash     string `json:"hash,omitempty"`
}

// AuthorizationView is an authorization as a decision shows it.
type AuthorizationView struct {
	ID                string     `json:"id"`
	State             AuthState  `json:"state"`
	Version           int64      `json:"version"`
	Operation         string     `json:"operation"`
	Target            string     `json:"target,omitempty"` // empty only on a recorded read that named none
	Amount            Money      `json:"amount,omitzero"`  // zero (absent) only on a recorded read
	IdempotencyKey    string     `json:"idempotency_key"`
	MandateVersion    int64      `json:"mandate_version"` // the mandate version it was reserved at
	Deadline          time.Time  `json:"deadline"`
	ExecutionDeadline *time.Time `json:"execution_deadline,omitempty"`
	ExternalRef       string     `json:"external_ref,omitempty"`
	Executor          string     `json:"executor,omitempty"`        // the begin that won
	ExecutionToken    int64      `json:"execution_token,omitempty"` // its fencing token
	// Result is the provider's answer the winning commit recorded (a JSON object).
	Result json.RawMessage `json:"result,omitempty"`
	ForkOf string          `json:"fork_of,omitempty"` // the authorization of the same intent it superseded
	// Detail is what the command that last moved it said (a cancel's
	// reason or proof, report_unknown's detail, resolve's evidence).
	Detail string `json:"detail,omitempty"`
	// Resolved is set once reconciliation settled the execution: the
	// executor's token acts no more.
	Resolved bool `json:"resolved,omitempty"`
	// Reported is what was said when the execution went in doubt
	// (report_unknown's detail, or the execution timeout's), kept after
	// a resolve; ResolvedBy names the reconciler that resolved it (the
	// resolve's reconciler member), so a resolved execution keeps who
	// settled it, on what evidence (Detail) and what was reported.
	Reported   string    `json:"reported,omitempty"`
	ResolvedBy string    `json:"resolved_by,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// MandateView is a mandate as a decision shows it.
type MandateView struct {
	Version int64 `json:"version"`
	// TermsVersion is the version the mandate's last grant made (0 for a
	// mandate last granted before migration 0020): a grant bound to a
	// version older than it is refused stale_grant.
	TermsVersion  int64         `json:"terms_version,omitempty"`
	Status        MandateStatus `json:"status"`
	UsesAllowed   int64         `json:"uses_allowed"`
	UsesHeld      int64         `json:"uses_held"`
	UsesSpent     int64         `json:"uses_spent"`
	UsesInDoubt   int64         `json:"uses_in_doubt"`
	Currency      string        `json:"currency"`
	MaxAmount     int64         `json:"max_amount_minor_units"`
	TotalLimit    *int64        `json:"total_limit_minor_units,omitempty"`
	AmountHeld    int64         `json:"amount_held_minor_units"`
	AmountSpent   int64         `json:"amount_spent_minor_units"`
	ValidUntil    *time.Time    `json:"valid_until,omitempty"`
	ReleaseCancel bool          `json:"release_on_cancel"`
	// The rest of the grant's terms and the mandate's running state, so
	// that the decisions alone rebuild the mandate (mandatectl recover).
	// Decisions written before they were added lack them.
	Operations       []string   `json:"operations,omitempty"`
	Targets          []string   `json:"targets,omitempty"` // empty: any target
	ValidFrom        *time.Time `json:"valid_from,omitempty"`
	HoldSeconds      int64      `json:"hold_seconds,omitempty"`
	ExecutionTimeout int64      `json:"execution_timeout_seconds,omitempty"`
	Executions       int64      `json:"executions,omitempty"`            // the last execution token handed out
	LastAuthID       string     `json:"last_authorization_id,omitempty"` // the authorization that last took a use
}

// Binding is what a decision bound for later commands. An idempotency key
// is bound by the first answer about authority for it (its key is the
// decision's idempotency_key); an intent by the proposal that reserved its
// first authorization, and moved to each fork.
type Binding struct {
	Idempotency *KeyBinding    `json:"idempotency,omitempty"`
	Intent      *IntentBinding `json:"intent,omitempty"`
}

// KeyBinding is a bound idempotency key: its scope's operation (the
// proposal's, or grantor:grant / grantor:revoke), the fingerprint of the
// command's material fields (lower-case hex SHA-256) that a reuse must
// match, and when it may be purged.
type KeyBinding struct {
	Operation   string    `json:"operation"`
	Fingerprint string    `json:"fingerprint"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// IntentBinding is a bound intent: its scope (the proposal's operation and
// the intent's facts) and when it may be purged (never while its latest
// authorization is live).
type IntentBinding struct {
	Operation string    `json:"operation"`
	RunID     string    `json:"run_id"`
	Step      string    `json:"step"`
	Action    string    `json:"action"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Source is the Kafka record a decision answers.
type Source struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// DecisionID formats a decision id.
func DecisionID(partition int32, seq int64) string { return fmt.Sprintf("%d-%d", partition, seq) }

// ParseDecision decodes a decision published by mandated.
func ParseDecision(b []byte) (*Decision, error) {
	var d Decision
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("parse decision: %w", err)
	}
	if d.V != SchemaVersion {
		return nil, fmt.Errorf("parse decision: schema version %d is not %d", d.V, SchemaVersion)
	}
	return &d, nil
}

// Dead-letter record headers. The value is the original record value, capped
// at DeadLetterMaxBytes; the key is the original key, capped likewise.
const (
	HeaderReason      = "mandated-reason"
	HeaderDetail      = "mandated-detail"
	HeaderSourceTopic = "mandated-source-topic"
	HeaderSourcePart  = "mandated-source-partition"
	HeaderSourceOff   = "mandated-source-offset"
	HeaderTruncated   = "mandated-truncated"
	HeaderSequence    = "mandated-sequence" // on every record mandated publishes
	HeaderEpoch       = "mandated-epoch"
	DeadLetterMaxByte = 16 << 10
)

// HeaderRequest, on a command record, names the HTTP gateway request it was
// produced for (ValidRequestID): the processor keeps the decision that
// answers the record under that id for the org's retention, so any gateway
// instance can answer the request's status URL.
const HeaderRequest = "mandated-request"

// HeaderTraceParent is the W3C trace context header ("traceparent"). A
// command record may carry it (the gateway's produce does when tracing is
// on); the processor keeps it with the decisions answering the record, and
// the relay publishes it on them, so a decision carries the trace of the
// command it answers. It is not covered by the decision chain (the chain
// hashes the record's value), and it decides nothing.
const HeaderTraceParent = "traceparent"
