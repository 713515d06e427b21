package mcpguard

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The recorded result is a JSON object the commit carries:
//
//	{"mcp_result": "<the upstream's CallToolResult as JSON text>"}
//
// The result travels as JSON text inside a string, with every non-ASCII
// character escaped, because the contract refuses control characters in a
// decision's strings (a result's text may hold line breaks and tabs, but
// not the escape sequences and C1 controls a tool's output may carry), and
// the upstream's result is recorded exactly, whatever it holds.
//
// Every caller of an intent, the one that ran the tool too, is answered
// from the record, so all get the same answer. When the full result would
// exceed Config.MaxResultBytes the record holds less, beside "oversize":
// true, the full result's size and SHA-256: first the structured content
// whole with the beginning of the text (a tool with an output schema stays
// valid); when even that does not fit, the beginning of the text alone —
// marked isError for a tool with an output schema, since there is no
// structured content to give and a client refuses a success without it.
const stubTextBytes = 1024

type recordedResult struct {
	Result   string `json:"mcp_result"`
	Oversize bool   `json:"oversize,omitempty"`
	Bytes    int    `json:"bytes,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
}

// record encodes res as the recorded result, within max bytes. structured
// says the tool declares an output schema.
func record(res *mcp.CallToolResult, max int, structured bool) (json.RawMessage, error) {
	full, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encode the upstream's result: %w", err)
	}
	b, err := json.Marshal(recordedResult{Result: asciiJSON(full)})
	if err != nil {
		return nil, err
	}
	if len(b) <= max {
		return b, nil
	}
	sum := sha256.Sum256(full)
	hash := hex.EncodeToString(sum[:])
	text := textOf(res)
	stub := func(cut int, note string) *mcp.CallToolResult {
		t := text
		if len(t) > cut {
			t = strings.ToValidUTF8(t[:cut], "")
		}
		return &mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
			"%s\n[mandated: the tool's result was %d bytes, over the %d recorded; this is the beginning of its text%s. sha256 of the full result: %s]",
			t, len(full), max, note, hash)}}}
	}
	var tries []*mcp.CallToolResult
	if res.StructuredContent != nil {
		for _, cut := range []int{stubTextBytes, 128, 0} {
			st := stub(cut, "; its structured content is whole")
			st.StructuredContent = res.StructuredContent
			tries = append(tries, st)
		}
	}
	note := ""
	if structured && !res.IsError {
		note = "; the tool ran once, but its structured content is too large to be recorded, so this answer is marked an error"
	}
	for _, cut := range []int{stubTextBytes, 128, 0} {
		st := stub(cut, note)
		st.IsError = res.IsError || structured
		tries = append(tries, st)
	}
	for _, st := range tries {
		sb, err := json.Marshal(st)
		if err != nil {
			return nil, err
		}
		b, err = json.Marshal(recordedResult{Result: asciiJSON(sb), Oversize: true, Bytes: len(full), SHA256: hash})
		if err != nil {
			return nil, err
		}
		if len(b) <= max {
			return b, nil
		}
	}
	return nil, fmt.Errorf("even the stub of the result is %d bytes, over --max-result-bytes %d", len(b), max)
}

// recorded decodes a recorded result: mandate-mcp's own (ours true), or
// nil and false when the record is not (an operator's reconciliation
// recorded the provider's answer, or nothing).
func recorded(raw json.RawMessage) (res *mcp.CallToolResult, ours bool, err error) {
	if len(raw) == 0 {
		return nil, false, nil
	}
	var rr recordedResult
	if json.Unmarshal(raw, &rr) != nil || rr.Result == "" {
		return nil, false, nil
	}
	res = &mcp.CallToolResult{}
	if err := json.Unmarshal([]byte(rr.Result), res); err != nil {
		return nil, true, fmt.Errorf("the recorded result does not decode: %w", err)
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	return res, true, nil
}

// asciiJSON escapes every non-ASCII character of a JSON text as \uXXXX:
// the same JSON value, in printable ASCII only (encoding/json already
// escapes the control characters).
func asciiJSON(b []byte) string {
	var sb strings.Builder
	sb.Grow(len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		switch {
		case r < 0x7f:
			sb.WriteByte(byte(r))
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&sb, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(&sb, `\u%04x`, r)
		}
	}
	return sb.String()
}

func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}
