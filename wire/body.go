package wire

import "unicode/utf8"

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

// dataTreeLimits bound ParseData: a caller's free data (a tool's
// arguments) is wider and deeper than a command.
var dataTreeLimits = treeLimits{maxDepth: 32, maxTokens: 1 << 17, maxArray: 1 << 15, maxKeys: 1 << 12}

// ParseData parses raw as one JSON object of free data — a tool's
// arguments, say — with the decoder's scanner: valid UTF-8, no duplicate
// or case-variant members at any depth (the ambiguity a case-insensitive
// or first-wins decoder would read otherwise), no NUL or control
// characters except line breaks and tabs in strings, nothing after the
// object, within limits wider than a command's. Nested objects are
// map[string]any, arrays []any, numbers json.Number (exactly as written).
// mandate-mcp checks a tool call's arguments with it before it proposes
// anything from them and forwards the same bytes.
func ParseData(raw []byte) (map[string]any, *Rejection) {
	p := &scanner{buf: raw, lim: dataTreeLimits, text: true}
	if !utf8.Valid(raw) {
		return nil, &Rejection{Reason: ReasonInvalidUTF8, Detail: "the JSON is not valid UTF-8"}
	}
	p.skipSpace()
	if p.pos >= len(raw) || raw[p.pos] != '{' {
		return nil, &Rejection{Reason: ReasonMalformedJSON, Detail: "not a JSON object"}
	}
	v, perr := p.value(0)
	if perr == nil {
		p.skipSpace()
		if p.pos != len(raw) {
			perr = parseFail(ReasonMalformedJSON, "trailing data after the JSON object at byte %d", p.pos)
		}
	}
	if perr != nil {
		return nil, &Rejection{Reason: perr.reason, Detail: perr.detail}
	}
	return plain(v).(map[string]any), nil
}

// plain turns the scanner's objects into map[string]any, at every depth.
func plain(v any) any {
	switch x := v.(type) {
	case object:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = plain(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = plain(e)
		}
		return x
	}
	return v
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
