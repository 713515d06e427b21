package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/mandated/mandated/wire"
)

// Reasons the gateway adds to the wire's, for what only HTTP can get wrong.
const (
	ReasonUnauthenticated       wire.Reason = "unauthenticated"        // 401: no or unknown bearer token
	ReasonOrgForbidden          wire.Reason = "org_forbidden"          // 403: the token belongs to another org
	ReasonControlPlane          wire.Reason = "control_plane_only"     // 403: grants, revokes and resolves are not taken over HTTP
	ReasonNotFound              wire.Reason = "not_found"              // 404: no such route or resource
	ReasonNoDecisionRecorded    wire.Reason = "no_decision_recorded"   // 404: no decision bound to this key (yet)
	ReasonMethodNotAllowed      wire.Reason = "method_not_allowed"     // 405
	ReasonUnsupportedMediaType  wire.Reason = "unsupported_media_type" // 415
	ReasonTooManyInFlight       wire.Reason = "too_many_in_flight"     // 429
	ReasonMissingIdempotencyKey wire.Reason = "missing_idempotency_key"
	ReasonUnavailable           wire.Reason = "unavailable"       // 503: Kafka or PostgreSQL unreachable
	ReasonRequestNotFound       wire.Reason = "request_not_found" // 404: no such request (or past its retention)
	ReasonHeadersTooLarge       wire.Reason = "headers_too_large" // 431: the request's headers exceed the limit
	ReasonMalformedRequest      wire.Reason = "malformed_request" // 400/501: not an HTTP/1.1 request net/http can read
)

// Problem is an RFC 9457 problem details object. Type is
// "urn:mandated:reason:<reason>", so a client can branch on the same codes
// as a Kafka consumer of the decisions; the reason is also a member.
type Problem struct {
	Type     string          `json:"type"`
	Title    string          `json:"title"`
	Status   int             `json:"status"`
	Detail   string          `json:"detail,omitempty"`
	Instance string          `json:"instance,omitempty"`
	Reason   wire.Reason     `json:"reason"`
	Decision json.RawMessage `json:"decision,omitempty"` // the decision, when one was made
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, reason wire.Reason, detail string, decision json.RawMessage) {
	p := Problem{
		Type: "urn:mandated:reason:" + string(reason), Title: http.StatusText(status), Status: status,
		Detail: detail, Instance: r.URL.Path, Reason: reason, Decision: decision,
	}
	b := problemBytes(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// statusOf maps a decision to its HTTP status: a decision about authority
// (granted or not) is 200; a command that did not fit gets a problem status.
func statusOf(d *wire.Decision) int {
	switch d.Outcome {
	case wire.OutcomeRejected:
		if d.Reason == wire.ReasonTooLarge {
			return http.StatusRequestEntityTooLarge
		}
		return http.StatusBadRequest
	case wire.OutcomeConflict: // the same key with another payload (IETF idempotency-key draft)
		return http.StatusUnprocessableEntity
	case wire.OutcomeStale:
		return http.StatusConflict
	case wire.OutcomeRefused:
		switch d.Reason {
		case wire.ReasonAuthorizationNotFound, wire.ReasonNotRecorded, wire.ReasonMandateNotFound:
			// No such authorization; no record of the read yet (a
			// look-up); no mandate to record under.
			return http.StatusNotFound
		}
		return http.StatusConflict
	}
	return http.StatusOK
}

// ReasonAmbiguousHeader refuses a request that sends a single-valued
// header (Authorization, Idempotency-Key, Executor, Content-Type) more than
// once: as ambiguous as a duplicate JSON member, since whatever stands in
// front of the gateway may have read the other value.
const ReasonAmbiguousHeader wire.Reason = "ambiguous_header"
