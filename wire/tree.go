package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// object is a parsed JSON object. Values are string, json.Number, bool, nil,
// object or []any: the decoder keeps a number and a string apart, which
// encoding/json's struct decoding does not (it stores "100" in a json.Number).
type object map[string]any

// treeLimits bound the work one record can cost.
type treeLimits struct {
	maxDepth  int
	maxTokens int
	maxArray  int
	maxKeys   int
}

var defaultTreeLimits = treeLimits{maxDepth: 8, maxTokens: 4096, maxArray: 256, maxKeys: 64}

// parseError carries the reason a body could not be parsed.
type parseError struct {
	reason Reason
	detail string
}

func (e *parseError) Error() string { return string(e.reason) + ": " + e.detail }

func parseFail(r Reason, format string, args ...any) *parseError {
	return &parseError{reason: r, detail: fmt.Sprintf(format, args...)}
}

// parseObject parses raw as one JSON object, strictly: valid UTF-8, no
// duplicate or case-variant keys, no NUL or control characters in strings,
// no lone surrogates, bounded depth, width and token count, nothing after
// the object. It is a single-pass scanner over the bytes (encoding/json's
// token API costs an allocation per token, and decoding is the processor's
// hottest path).
func parseObject(raw []byte, lim treeLimits) (object, *parseError) {
	if !utf8.Valid(raw) {
		return nil, parseFail(ReasonInvalidUTF8, "the record value is not valid UTF-8")
	}
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if bytes.HasPrefix(trimmed, []byte("\xef\xbb\xbf")) {
		return nil, parseFail(ReasonMalformedJSON, "the record value starts with a byte-order mark")
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, parseFail(ReasonMalformedJSON, "the record value is not a JSON object")
	}
	p := &scanner{buf: raw, lim: lim}
	p.skipSpace()
	v, perr := p.value(0)
	if perr != nil {
		return nil, perr
	}
	p.skipSpace()
	if p.pos != len(p.buf) {
		return nil, parseFail(ReasonMalformedJSON, "trailing data after the JSON object at byte %d", p.pos)
	}
	return v.(object), nil
}

type scanner struct {
	buf    []byte
	pos    int
	lim    treeLimits
	tokens int
	// data: inside a top-level "result", a provider's answer, whose text
	// may hold line breaks and tabs (checkData); everywhere else strings
	// are ids, names and reasons (checkString).
	data bool
	// text: every string is free text, as in data (ParseData).
	text bool
}

// dataMember is the one top-level member whose strings are a provider's
// free text (a commit's or a resolve's result), not the contract's ids.
const dataMember = "result"

func (p *scanner) token() *parseError {
	p.tokens++
	if p.tokens > p.lim.maxTokens {
		return parseFail(ReasonTooComplex, "more than %d JSON tokens", p.lim.maxTokens)
	}
	return nil
}

func (p *scanner) skipSpace() {
	for p.pos < len(p.buf) {
		switch p.buf[p.pos] {
		case ' ', '\t', '\r', '\n':
			p.pos++
		default:
			return
		}
	}
}

func (p *scanner) syntax(what string) *parseError {
	if p.pos >= len(p.buf) {
		return parseFail(ReasonMalformedJSON, "unexpected end of JSON input (%s)", what)
	}
	return parseFail(ReasonMalformedJSON, "invalid character %q at byte %d (%s)", p.buf[p.pos], p.pos, what)
}

// value parses the value at p.pos; depth counts the containers around it.
func (p *scanner) value(depth int) (any, *parseError) {
	if p.pos >= len(p.buf) {
		return nil, p.syntax("looking for a value")
	}
	switch c := p.buf[p.pos]; {
	case c == '{' || c == '[':
		if depth+1 > p.lim.maxDepth {
			return nil, parseFail(ReasonTooComplex, "JSON nested deeper than %d", p.lim.maxDepth)
		}
		if perr := p.token(); perr != nil {
			return nil, perr
		}
		p.pos++
		if c == '{' {
			return p.object(depth + 1)
		}
		return p.array(depth + 1)
	case c == '"':
		if perr := p.token(); perr != nil {
			return nil, perr
		}
		s, perr := p.str()
		if perr != nil {
			return nil, perr
		}
		check := checkString
		if p.data || p.text {
			check = checkData
		}
		if perr := check(s); perr != nil {
			return nil, perr
		}
		return s, nil
	case c == '-' || c >= '0' && c <= '9':
		if perr := p.token(); perr != nil {
			return nil, perr
		}
		return p.number()
	default:
		for _, lit := range []struct {
			text string
			v    any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if bytes.HasPrefix(p.buf[p.pos:], []byte(lit.text)) {
				if perr := p.token(); perr != nil {
					return nil, perr
				}
				p.pos += len(lit.text)
				return lit.v, nil
			}
		}
		return nil, p.syntax("looking for a value")
	}
}

func (p *scanner) object(depth int) (object, *parseError) {
	obj := object{}
	folded := map[string]string{}
	p.skipSpace()
	if p.pos < len(p.buf) && p.buf[p.pos] == '}' {
		p.pos++
		return obj, p.token()
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.buf) || p.buf[p.pos] != '"' {
			return nil, p.syntax("looking for an object key")
		}
		if perr := p.token(); perr != nil {
			return nil, perr
		}
		key, perr := p.str()
		if perr != nil {
			return nil, perr
		}
		if perr := checkString(key); perr != nil {
			return nil, perr
		}
		lower := strings.ToLower(key)
		if prev, dup := folded[lower]; dup {
			if prev == key {
				return nil, parseFail(ReasonAmbiguousField, "key %q appears twice", key)
			}
			return nil, parseFail(ReasonAmbiguousField, "keys %q and %q differ only in case", prev, key)
		}
		folded[lower] = key
		if len(obj) >= p.lim.maxKeys {
			return nil, parseFail(ReasonTooComplex, "object with more than %d keys", p.lim.maxKeys)
		}
		p.skipSpace()
		if p.pos >= len(p.buf) || p.buf[p.pos] != ':' {
			return nil, p.syntax("after an object key")
		}
		p.pos++
		p.skipSpace()
		p.data = p.data || depth == 1 && key == dataMember
		v, perr := p.value(depth)
		if depth == 1 {
			p.data = false
		}
		if perr != nil {
			return nil, perr
		}
		obj[key] = v
		p.skipSpace()
		if p.pos >= len(p.buf) {
			return nil, p.syntax("after an object value")
		}
		switch p.buf[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return obj, p.token()
		default:
			return nil, p.syntax("after an object value")
		}
	}
}

func (p *scanner) array(depth int) ([]any, *parseError) {
	var arr []any
	p.skipSpace()
	if p.pos < len(p.buf) && p.buf[p.pos] == ']' {
		p.pos++
		return arr, p.token()
	}
	for {
		p.skipSpace()
		if len(arr) >= p.lim.maxArray {
			return nil, parseFail(ReasonTooComplex, "array with more than %d elements", p.lim.maxArray)
		}
		v, perr := p.value(depth)
		if perr != nil {
			return nil, perr
		}
		arr = append(arr, v)
		p.skipSpace()
		if p.pos >= len(p.buf) {
			return nil, p.syntax("after an array element")
		}
		switch p.buf[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return arr, p.token()
		default:
			return nil, p.syntax("after an array element")
		}
	}
}

// number scans a JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *scanner) number() (json.Number, *parseError) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.buf) && p.buf[p.pos] >= '0' && p.buf[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.buf[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.buf) && p.buf[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return "", p.syntax("in a number")
	}
	if p.pos < len(p.buf) && p.buf[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return "", p.syntax("after a decimal point")
		}
	}
	if p.pos < len(p.buf) && (p.buf[p.pos] == 'e' || p.buf[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.buf) && (p.buf[p.pos] == '+' || p.buf[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return "", p.syntax("in an exponent")
		}
	}
	return json.Number(p.buf[start:p.pos]), nil
}

// str scans a JSON string at p.pos (the opening quote) and returns it
// unescaped. A raw control character is a syntax error, as RFC 8259 says;
// an escaped lone surrogate is refused as invalid UTF-16.
func (p *scanner) str() (string, *parseError) {
	p.pos++ // the opening quote
	start := p.pos
	for p.pos < len(p.buf) {
		c := p.buf[p.pos]
		if c == '"' {
			s := string(p.buf[start:p.pos])
			p.pos++
			return s, nil
		}
		if c == '\\' {
			break // the slow path: escapes
		}
		if c < 0x20 {
			return "", p.syntax("in a string")
		}
		p.pos++
	}
	var b []byte
	b = append(b, p.buf[start:p.pos]...)
	for p.pos < len(p.buf) {
		c := p.buf[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(b), nil
		case c < 0x20:
			return "", p.syntax("in a string")
		case c != '\\':
			b = append(b, c)
			p.pos++
			continue
		}
		p.pos++
		if p.pos >= len(p.buf) {
			return "", p.syntax("in an escape")
		}
		e := p.buf[p.pos]
		p.pos++
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.syntax("in a \\u escape")
			}
			if utf16.IsSurrogate(r) {
				var r2 rune = -1
				if p.pos+1 < len(p.buf) && p.buf[p.pos] == '\\' && p.buf[p.pos+1] == 'u' {
					p.pos += 2
					if r2, ok = p.hex4(); !ok {
						return "", p.syntax("in a \\u escape")
					}
				}
				if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
					return "", parseFail(ReasonInvalidUTF8, "a string contains a lone surrogate escape")
				}
			}
			b = utf8.AppendRune(b, r)
		default:
			p.pos--
			return "", p.syntax("in an escape")
		}
	}
	return "", p.syntax("in a string")
}

func (p *scanner) hex4() (rune, bool) {
	if p.pos+4 > len(p.buf) {
		return 0, false
	}
	var r rune
	for _, c := range p.buf[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

// checkString refuses what PostgreSQL would refuse later (NUL) and what
// would make ids or logs lie (control characters, replacement characters).
func checkString(s string) *parseError { return checkText(s, false) }

// checkData is checkString for a provider's free text: line feeds,
// carriage returns and tabs are text there (an address, a message), kept
// escaped wherever the result is written again (JSON re-encoding); every
// other control character is still refused (an escape sequence would
// rewrite an operator's terminal).
func checkData(s string) *parseError { return checkText(s, true) }

func checkText(s string, lineBreaks bool) *parseError {
	for _, r := range s {
		switch {
		case lineBreaks && (r == '\n' || r == '\r' || r == '\t'):
		case r == 0:
			return parseFail(ReasonNULByte, "a string contains a NUL character")
		case r == utf8.RuneError:
			return parseFail(ReasonInvalidUTF8, "a string contains U+FFFD (an invalid or lone-surrogate escape)")
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			return parseFail(ReasonControlChar, "a string contains control character U+%04X", r)
		}
	}
	return nil
}
