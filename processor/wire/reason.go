package wire

// Reason is a machine-readable reason code carried by a decision or a dead
// letter. Codes are stable: consumers branch on them.
type Reason string

// Reasons for rejected input (outcome "rejected", or a dead letter when no
// mandate key can be read).
const (
	ReasonTooLarge           Reason = "too_large"
	ReasonMalformedJSON      Reason = "malformed_json"
	ReasonInvalidUTF8        Reason = "invalid_utf8"
	ReasonNULByte            Reason = "nul_byte"
	ReasonControlChar        Reason = "control_char"
	ReasonAmbiguousField     Reason = "ambiguous_field"
	ReasonUnknownField       Reason = "unknown_field"
	ReasonTooComplex         Reason = "too_complex"
	ReasonUnsupportedVersion Reason = "unsupported_schema_version"
	ReasonUnknownCommand     Reason = "unknown_command"
	ReasonMissingField       Reason = "missing_field"
	ReasonFieldInvalid       Reason = "field_invalid"
	ReasonIDInvalid          Reason = "id_invalid"
	ReasonAmountInvalid      Reason = "amount_invalid"
	ReasonCurrencyInvalid    Reason = "currency_invalid"
	ReasonTimestampInvalid   Reason = "timestamp_invalid"
	ReasonDeadlineInvalid    Reason = "deadline_invalid"
	ReasonMissingIdentity    Reason = "missing_identity"
	ReasonMissingRecordKey   Reason = "missing_record_key"
	ReasonKeyMismatch        Reason = "key_mismatch"
	ReasonMisrouted          Reason = "misrouted"
	ReasonWrongTopic         Reason = "wrong_topic"
	ReasonGrantOnProposals   Reason = "grant_not_allowed_on_proposals"
	ReasonProposalOnGrants   Reason = "proposal_not_allowed_on_grants"
	ReasonResolveOnProposals Reason = "resolve_not_allowed_on_proposals"
	ReasonHeaderInvalid      Reason = "header_invalid"
	ReasonStorageRefused     Reason = "storage_refused"
)

// Reasons for denials, refusals and conflicts decided by the lifecycle.
const (
	ReasonMandateNotFound     Reason = "mandate_not_found"
	ReasonMandateRevoked      Reason = "mandate_revoked"
	ReasonMandateNotYetValid  Reason = "mandate_not_yet_valid"
	ReasonMandateExpired      Reason = "mandate_expired"
	ReasonOperationNotAllowed Reason = "operation_not_allowed"
	ReasonTargetNotAllowed    Reason = "target_not_allowed"
	ReasonCurrencyMismatch    Reason = "currency_mismatch"
	ReasonAmountExceedsMax    Reason = "amount_exceeds_max"
	ReasonTotalLimitExceeded  Reason = "total_limit_exceeded"
	ReasonUsesExhausted       Reason = "uses_exhausted"
	ReasonInDoubtPending      Reason = "in_doubt_pending"
	ReasonStaleVersion        Reason = "stale_version"
	ReasonIdempotencyConflict Reason = "idempotency_key_reused"

	ReasonAuthorizationNotFound Reason = "authorization_not_found"
	ReasonDeadlinePassed        Reason = "deadline_passed"
	ReasonAlreadyExecuting      Reason = "already_executing"
	ReasonStaleExecutionToken   Reason = "stale_execution_token"
	ReasonNotExecuting          Reason = "not_executing"
	ReasonNotInDoubt            Reason = "not_in_doubt"
	ReasonProofRequired         Reason = "not_executed_proof_required"
	ReasonTerminal              Reason = "terminal_state"
	ReasonOtherExternalRef      Reason = "committed_with_other_external_ref"
	ReasonGrantBelowUsage       Reason = "grant_below_usage"
	ReasonCurrencyChange        Reason = "currency_change_with_usage"

	ReasonReservationExpired Reason = "reservation_deadline_passed"
	ReasonExecutionTimeout   Reason = "execution_timeout"
	ReasonRevokedByGrantor   Reason = "revoked_by_grantor"
)
