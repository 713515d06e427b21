package wire

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Encode marshals a decision. It appends the fixed field set directly
// (reflection-based encoding/json was a tenth of the processor's CPU); the
// output is the same JSON object encoding/json would write, field for
// field, which TestEncodeMatchesEncodingJSON holds it to.
func (d *Decision) Encode() ([]byte, error) {
	b := make([]byte, 0, 1024+chainMembersLen) // room for the chain members Seal appends
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(d.V), 10)
	b = appendStrField(b, "decision_id", d.DecisionID, false)
	b = appendIntField(b, "sequence", d.Sequence)
	b = appendIntField(b, "partition", int64(d.Partition))
	b = appendIntField(b, "epoch", d.Epoch)
	b = appendStrField(b, "mandate_key", d.MandateKey, false)
	b = appendStrField(b, "org", d.Org, false)
	b = appendStrField(b, "mandate_id", d.MandateID, false)
	b = appendStrField(b, "command", d.Command, false)
	b = appendStrField(b, "idempotency_key", d.IdempotencyKey, true)
	b = appendStrField(b, "authorization_id", d.AuthorizationID, true)
	b = appendStrField(b, "outcome", string(d.Outcome), false)
	b = appendStrField(b, "reason", string(d.Reason), true)
	b = appendStrField(b, "detail", d.Detail, true)
	b = appendStrField(b, "replay_of", d.ReplayOf, true)
	b = appendStrField(b, "original_outcome", string(d.OriginalOutcome), true)
	if d.ExecutionToken != 0 {
		b = appendIntField(b, "execution_token", d.ExecutionToken)
	}
	b = appendStrField(b, "fork_of", d.ForkOf, true)
	b = appendStrField(b, "possible_replay_of", d.PossibleReplay, true)
	if d.Authorization != nil {
		b = append(b, `,"authorization":`...)
		b = appendAuthorization(b, d.Authorization)
	}
	if d.HeldBy != nil {
		b = append(b, `,"held_by":`...)
		b = appendAuthorization(b, d.HeldBy)
	}
	if m := d.Mandate; m != nil {
		b = append(b, `,"mandate":{"version":`...)
		b = strconv.AppendInt(b, m.Version, 10)
		if m.TermsVersion != 0 {
			b = appendIntField(b, "terms_version", m.TermsVersion)
		}
		b = appendStrField(b, "status", string(m.Status), false)
		b = appendIntField(b, "uses_allowed", m.UsesAllowed)
		b = appendIntField(b, "uses_held", m.UsesHeld)
		b = appendIntField(b, "uses_spent", m.UsesSpent)
		b = appendIntField(b, "uses_in_doubt", m.UsesInDoubt)
		b = appendStrField(b, "currency", m.Currency, false)
		b = appendIntField(b, "max_amount_minor_units", m.MaxAmount)
		if m.TotalLimit != nil {
			b = appendIntField(b, "total_limit_minor_units", *m.TotalLimit)
		}
		b = appendIntField(b, "amount_held_minor_units", m.AmountHeld)
		b = appendIntField(b, "amount_spent_minor_units", m.AmountSpent)
		if m.ValidUntil != nil {
			b = appendTimeField(b, "valid_until", *m.ValidUntil)
		}
		b = append(b, `,"release_on_cancel":`...)
		b = strconv.AppendBool(b, m.ReleaseCancel)
		b = appendStrings(b, "operations", m.Operations)
		b = appendStrings(b, "targets", m.Targets)
		if m.ValidFrom != nil {
			b = appendTimeField(b, "valid_from", *m.ValidFrom)
		}
		if m.HoldSeconds != 0 {
			b = appendIntField(b, "hold_seconds", m.HoldSeconds)
		}
		if m.ExecutionTimeout != 0 {
			b = appendIntField(b, "execution_timeout_seconds", m.ExecutionTimeout)
		}
		if m.Executions != 0 {
			b = appendIntField(b, "executions", m.Executions)
		}
		b = appendStrField(b, "last_authorization_id", m.LastAuthID, true)
		b = append(b, '}')
	}
	if d.HomePartition != nil {
		b = appendIntField(b, "home_partition", int64(*d.HomePartition))
	}
	if s := d.Source; s != nil {
		b = append(b, `,"source":{"topic":`...)
		b = appendString(b, s.Topic)
		b = appendIntField(b, "partition", int64(s.Partition))
		b = appendIntField(b, "offset", s.Offset)
		b = append(b, '}')
	}
	b = appendTimeField(b, "decided_at", d.DecidedAt)
	if d.SentAt != nil {
		b = appendTimeField(b, "sent_at", *d.SentAt)
	}
	b = appendStrField(b, "signed_by", d.SignedBy, true)
	b = appendStrings(b, "differs", d.Differs)
	if bd := d.Binds; bd != nil {
		b = append(b, `,"binds":{`...)
		if k := bd.Idempotency; k != nil {
			b = append(b, `"idempotency":{"operation":`...)
			b = appendString(b, k.Operation)
			b = appendStrField(b, "fingerprint", k.Fingerprint, false)
			b = appendTimeField(b, "expires_at", k.ExpiresAt)
			b = append(b, '}')
		}
		if in := bd.Intent; in != nil {
			if bd.Idempotency != nil {
				b = append(b, ',')
			}
			b = append(b, `"intent":{"operation":`...)
			b = appendString(b, in.Operation)
			b = appendStrField(b, "run_id", in.RunID, false)
			b = appendStrField(b, "step", in.Step, false)
			b = appendStrField(b, "action", in.Action, false)
			b = appendTimeField(b, "expires_at", in.ExpiresAt)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	// The chain members come last, in this order: Seal appends them to an
	// encoding without them, and the canonical form strips the hash member.
	b = appendStrField(b, "prev_hash", d.PrevHash, true)
	b = appendStrField(b, "hash", d.Hash, true)
	return append(b, '}'), nil
}

func appendAuthorization(b []byte, a *AuthorizationView) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, a.ID)
	b = appendStrField(b, "state", string(a.State), false)
	b = appendIntField(b, "version", a.Version)
	b = appendStrField(b, "operation", a.Operation, false)
	b = appendStrField(b, "target", a.Target, true)
	if a.Amount != (Money{}) {
		b = append(b, `,"amount":{"minor_units":`...)
		b = strconv.AppendInt(b, a.Amount.MinorUnits, 10)
		b = appendStrField(b, "currency", a.Amount.Currency, false)
		b = append(b, '}')
	}
	b = appendStrField(b, "idempotency_key", a.IdempotencyKey, false)
	b = appendIntField(b, "mandate_version", a.MandateVersion)
	b = appendTimeField(b, "deadline", a.Deadline)
	if a.ExecutionDeadline != nil {
		b = appendTimeField(b, "execution_deadline", *a.ExecutionDeadline)
	}
	b = appendStrField(b, "external_ref", a.ExternalRef, true)
	b = appendStrField(b, "executor", a.Executor, true)
	if a.ExecutionToken != 0 {
		b = appendIntField(b, "execution_token", a.ExecutionToken)
	}
	if len(a.Result) > 0 {
		// Stored as the decoder re-encoded it: compact, sorted keys,
		// HTML-escaped, which is what encoding/json writes for a RawMessage.
		b = append(b, `,"result":`...)
		b = append(b, a.Result...)
	}
	b = appendStrField(b, "fork_of", a.ForkOf, true)
	b = appendStrField(b, "detail", a.Detail, true)
	if a.Resolved {
		b = append(b, `,"resolved":true`...)
	}
	b = appendStrField(b, "reported", a.Reported, true)
	b = appendStrField(b, "resolved_by", a.ResolvedBy, true)
	b = appendTimeField(b, "created_at", a.CreatedAt)
	b = appendTimeField(b, "updated_at", a.UpdatedAt)
	return append(b, '}')
}

// appendStrings writes a string array member, omitted when empty.
func appendStrings(b []byte, name string, vs []string) []byte {
	if len(vs) == 0 {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':', '[')
	for i, v := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, v)
	}
	return append(b, ']')
}

func appendIntField(b []byte, name string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

func appendStrField(b []byte, name, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, v)
}

func appendTimeField(b []byte, name string, t time.Time) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':', '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string as encoding/json does: control
// characters, quotes, backslashes and HTML-sensitive characters escaped,
// invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
