package client

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// ErrUnverifiedDecision says a decision is not signed by a key of the
// deployment valid when it was made (wire.ErrUnverified): mandated did not
// write it.
var ErrUnverifiedDecision = wire.ErrUnverified

// VerifyDecision checks a decision record as published (its bytes and its
// mandated-signature header) against keys: its content must hash to its
// chain hash, and a key valid at its decided_at must have signed that hash.
// It returns the signing key's id, or an error that is
// ErrUnverifiedDecision.
func VerifyDecision(keys wire.DecisionKeyring, value, signature []byte) (string, error) {
	d, err := wire.ParseDecision(value)
	if err != nil {
		return "", &wire.UnverifiedError{Kind: wire.UnverifiedMalformed, Why: err.Error()}
	}
	link, err := wire.DecisionLink(value)
	if err != nil || !link.Intact() {
		return "", &wire.UnverifiedError{Kind: wire.UnverifiedMalformed, Why: "its content does not hash to its chain hash"}
	}
	return wire.VerifyRecordSignature(keys, signature, link.Computed, d.DecidedAt)
}

// signed keeps the record's signature on d and, with Config.DecisionKeys,
// reports whether a key of the deployment signed it (a record that fails
// is logged and counted, and must be dropped).
func (c *Client) signed(r *kgo.Record, d *Decision) bool {
	for _, h := range r.Headers {
		if h.Key == wire.HeaderSignature {
			d.Signature = append([]byte{}, h.Value...)
			break
		}
	}
	if c.cfg.DecisionKeys == nil {
		return true
	}
	_, err := VerifyDecision(c.cfg.DecisionKeys, r.Value, d.Signature)
	if err == nil {
		return true
	}
	c.unverified.Add(1)
	var ue *wire.UnverifiedError
	why := err.Error()
	if errors.As(err, &ue) {
		why = ue.Why
		// A keyring that reads the keys (sink.DecisionKeyCache) says why it
		// could not: a role without SELECT on decision_keys, say.
		if k, ok := c.cfg.DecisionKeys.(interface{ Err() error }); ok && ue.Kind == wire.UnverifiedUnknownKey && k.Err() != nil {
			why += " (the decision keys could not be read: " + k.Err().Error() + ")"
		}
	}
	c.log.Error().Int32("partition", r.Partition).Int64("offset", r.Offset).Int64("sequence", d.Sequence).
		Int64("producer_id", r.ProducerID).Str("why", why).
		Msg("dropped a decision mandated did not sign (someone holding its Kafka credential wrote it): waiting for mandated's own")
	return false
}
