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
	ReasonIntentReplayed      Reason = "intent_replayed"            // replayed: the intent already has an authorization
	ReasonPossibleReplay      Reason = "possible_replay"            // denied: the same material proposal was recently committed or begun
	ReasonForkOfLive          Reason = "fork_of_live_authorization" // refused: a fork must supersede a terminal authorization
	ReasonForkOfUnknown       Reason = "fork_of_unknown"            // refused: fork_of is not the intent's latest authorization
	ReasonNotRecorded         Reason = "not_recorded"               // refused: a record look-up found nothing recorded for the intent

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
	// ReasonWindowsExceedRetention refuses a grant whose hold window plus
	// execution timeout outlast the org's idempotency-key retention.
	ReasonWindowsExceedRetention Reason = "windows_exceed_retention"
	// ReasonStaleGrant refuses a grant bound to a mandate version (every
	// signed grant is) whose terms are no longer those it was based on: a
	// captured older grant replayed, or a grant that did not see a newer one.
	ReasonStaleGrant Reason = "stale_grant"

	ReasonReservationExpired Reason = "reservation_deadline_passed"
	ReasonExecutionTimeout   Reason = "execution_timeout"
	ReasonRevokedByGrantor   Reason = "revoked_by_grantor"
)

// Reasons for a refused signature (outcome "rejected": nothing changes).
const (
	ReasonSignatureMissing    Reason = "signature_missing"     // the org requires signed grantor commands
	ReasonSignatureMalformed  Reason = "signature_malformed"   // not {key_id, alg: ed25519, sig: base64 of 64 bytes}
	ReasonSignatureUnknownKey Reason = "signature_unknown_key" // no such key for the command's org
	ReasonSignatureKeyExpired Reason = "signature_key_expired" // outside the key's validity window
	ReasonSignatureKeyRevoked Reason = "signature_key_revoked" // the key was revoked
	ReasonSignatureInvalid    Reason = "signature_invalid"     // the signature does not verify
)
