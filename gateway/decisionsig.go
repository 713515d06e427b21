package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// Decisions only mandated could have written, over HTTP. The gateway's
// client checks every decision it reads against the deployment's keys
// (client.Config.DecisionKeys, cmd/mandate-gateway): one no key signed is
// never an answer. The signature goes on to the caller, who can check it
// without trusting the gateway: the response header Mandated-Signature is
// the record's mandated-signature header, over the decision's chain hash,
// and the decision's bytes are the ones published — a 200's body followed
// by a newline, a problem's last member "decision" verbatim — so the
// caller re-hashes them (docs/wire.md, "The decision chain") and checks
// the signature over that hash with the keys the operator gave it
// (mandatectl decision-keys list --json).

// HeaderSignature is the response header that carries a decision's
// signature.
const HeaderSignature = "Mandated-Signature"

// setSignature hands a decision's signature on (none for one read back
// from PostgreSQL).
func setSignature(w http.ResponseWriter, sig []byte) {
	if len(sig) > 0 {
		w.Header().Set(HeaderSignature, string(sig))
	}
}

// problemBytes encodes a problem with its decision, when it has one, as the
// last member and byte for byte as published (json.Marshal would escape
// <, > and & in it, and the caller could not re-hash it).
func problemBytes(p Problem) []byte {
	decision := p.Decision
	p.Decision = nil
	b, _ := json.Marshal(p)
	if len(decision) == 0 {
		return b
	}
	out := make([]byte, 0, len(b)+len(decision)+16)
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"decision":`...)
	out = append(out, bytes.TrimSpace(decision)...)
	return append(out, '}')
}
