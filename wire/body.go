package wire

// ParseObject parses raw as one JSON object by the contract's rules, with
// the decoder's own scanner and limits (valid UTF-8, no duplicate or
// case-variant members, no NUL or control characters, bounded depth, width
// and token count, nothing after the object), and returns its top-level
// members: string, json.Number, bool, nil, []any or a nested object (a
// map[string]any underneath). A body it refuses gets the reason Decode
// gives a record made of it: the HTTP gateway checks a request body with
// it before building the record around the body's exact bytes.
func ParseObject(raw []byte) (map[string]any, *Rejection) {
	obj, perr := parseObject(raw, defaultTreeLimits)
	if perr != nil {
		return nil, &Rejection{Reason: perr.reason, Detail: perr.detail}
	}
	return obj, nil
}

// MaxRequestIDBytes bounds the HeaderRequest value the processor keeps.
const MaxRequestIDBytes = 64

// ValidRequestID reports whether s may name a gateway request: 16 to
// MaxRequestIDBytes bytes of [a-z0-9] (the gateway mints 26 of base32).
func ValidRequestID(s string) bool {
	if len(s) < 16 || len(s) > MaxRequestIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
