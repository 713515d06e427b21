package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
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
// no U+FFFD (encoding/json's silent replacement for lone surrogates), bounded
// depth, width and token count, nothing after the object.
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
	p := &treeParser{dec: json.NewDecoder(bytes.NewReader(raw)), lim: lim}
	p.dec.UseNumber()
	v, perr := p.value(0)
	if perr != nil {
		return nil, perr
	}
	if _, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		return nil, parseFail(ReasonMalformedJSON, "trailing data after the JSON object")
	}
	obj, ok := v.(object)
	if !ok {
		return nil, parseFail(ReasonMalformedJSON, "the record value is not a JSON object")
	}
	return obj, nil
}

type treeParser struct {
	dec    *json.Decoder
	lim    treeLimits
	tokens int
}

func (p *treeParser) token() (json.Token, *parseError) {
	p.tokens++
	if p.tokens > p.lim.maxTokens {
		return nil, parseFail(ReasonTooComplex, "more than %d JSON tokens", p.lim.maxTokens)
	}
	tok, err := p.dec.Token()
	if err != nil {
		return nil, parseFail(ReasonMalformedJSON, "%v", err)
	}
	return tok, nil
}

func (p *treeParser) value(depth int) (any, *parseError) {
	tok, perr := p.token()
	if perr != nil {
		return nil, perr
	}
	return p.valueFrom(tok, depth)
}

func (p *treeParser) valueFrom(tok json.Token, depth int) (any, *parseError) {
	switch t := tok.(type) {
	case json.Delim:
		if depth+1 > p.lim.maxDepth {
			return nil, parseFail(ReasonTooComplex, "JSON nested deeper than %d", p.lim.maxDepth)
		}
		switch t {
		case '{':
			return p.object(depth + 1)
		case '[':
			return p.array(depth + 1)
		}
		return nil, parseFail(ReasonMalformedJSON, "unexpected %q", t)
	case string:
		if perr := checkString(t); perr != nil {
			return nil, perr
		}
		return t, nil
	case json.Number, bool, nil:
		return t, nil
	}
	return nil, parseFail(ReasonMalformedJSON, "unexpected token %v", tok)
}

func (p *treeParser) object(depth int) (object, *parseError) {
	obj := object{}
	folded := map[string]string{}
	for {
		tok, perr := p.token()
		if perr != nil {
			return nil, perr
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			return obj, nil
		}
		key, ok := tok.(string)
		if !ok {
			return nil, parseFail(ReasonMalformedJSON, "object key is not a string")
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
		v, perr := p.value(depth)
		if perr != nil {
			return nil, perr
		}
		obj[key] = v
	}
}

func (p *treeParser) array(depth int) ([]any, *parseError) {
	var arr []any
	for {
		tok, perr := p.token()
		if perr != nil {
			return nil, perr
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			return arr, nil
		}
		if len(arr) >= p.lim.maxArray {
			return nil, parseFail(ReasonTooComplex, "array with more than %d elements", p.lim.maxArray)
		}
		v, perr := p.valueFrom(tok, depth)
		if perr != nil {
			return nil, perr
		}
		arr = append(arr, v)
	}
}

// checkString refuses what PostgreSQL would refuse later (NUL) and what
// would make ids or logs lie (control characters, replacement characters).
func checkString(s string) *parseError {
	for _, r := range s {
		switch {
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
