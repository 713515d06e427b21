package client

import (
	"bytes"
	"encoding/json"

	"github.com/mandated/mandated/wire"
)

// Decision is one answer from the decisions topic, with its bytes as
// published (fields newer than this build are kept there).
type Decision struct {
	wire.Decision
	Raw json.RawMessage
	// Signature is the record's mandated-signature header as read (nil
	// without one): the gateway hands it to HTTP callers.
	Signature []byte
}

// extras are decision fields read from the raw bytes, so the client works
// against servers with and without the executor boundary.
type extras struct {
	ExecutionToken int64 `json:"execution_token"`
	Authorization  *struct {
		Executor       string          `json:"executor"`
		ExecutionToken int64           `json:"execution_token"`
		Result         json.RawMessage `json:"result"`
	} `json:"authorization"`
}

func (d *Decision) extras() extras {
	var e extras
	_ = json.Unmarshal(d.Raw, &e)
	return e
}

// ExecutionToken is the execution token the decision carries (0 from a
// server without executor tokens).
func (d *Decision) ExecutionToken() int64 {
	e := d.extras()
	if e.ExecutionToken != 0 {
		return e.ExecutionToken
	}
	if e.Authorization != nil {
		return e.Authorization.ExecutionToken
	}
	return 0
}

// Result is the result recorded with the authorization's commit (nil from a
// server without executor tokens, or before the commit).
func (d *Decision) Result() json.RawMessage {
	if e := d.extras(); e.Authorization != nil && len(e.Authorization.Result) > 0 && !bytes.Equal(e.Authorization.Result, []byte("null")) {
		return e.Authorization.Result
	}
	return nil
}

// State is the authorization's state after the decision ("" when the
// decision is about no authorization).
func (d *Decision) State() wire.AuthState {
	if d.Authorization == nil {
		return ""
	}
	return d.Authorization.State
}

func parseDecision(b []byte) (*Decision, error) {
	wd, err := wire.ParseDecision(b)
	if err != nil {
		return nil, err
	}
	return &Decision{Decision: *wd, Raw: append(json.RawMessage(nil), b...)}, nil
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
