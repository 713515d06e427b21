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
// the upstream's result is recorded exactly, whatever it holds. When the
// object would exceed Config.MaxResultBytes, the record instead holds a
// stub result — the first part of the text content, the full result's
// size and SHA-256 — beside "oversize": true. The winner answers with the
// full result; every repeat gets the stub.
const stubTextBytes = 1024

type recordedResult struct {
	Result   string `json:"mcp_result"`
	Oversize bool   `json:"oversize,omitempty"`
	Bytes    int    `json:"bytes,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
}

// record encodes res as the recorded result, within max bytes.
func record(res *mcp.CallToolResult, max int) (rec json.RawMessage, oversize bool, err error) {
	full, err := json.Marshal(res)
	if err != nil {
		return nil, false, fmt.Errorf("encode the upstream's result: %w", err)
	}
	b, err := json.Marshal(recordedResult{Result: asciiJSON(full)})
	if err != nil {
		return nil, false, err
	}
	if len(b) <= max {
		return b, false, nil
	}
	sum := sha256.Sum256(full)
	text := textOf(res)
	if len(text) > stubTextBytes {
		text = strings.ToValidUTF8(text[:stubTextBytes], "")
	}
	stub := &mcp.CallToolResult{IsError: res.IsError, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
		"%s\n[mandated: the tool's result was %d bytes, over the %d recorded; this is its beginning. sha256 of the full result: %s]",
		text, len(full), max, hex.EncodeToString(sum[:]))}}}
	sb, err := json.Marshal(stub)
	if err != nil {
		return nil, false, err
	}
	b, err = json.Marshal(recordedResult{Result: asciiJSON(sb), Oversize: true, Bytes: len(full), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return nil, false, err
	}
	if len(b) > max {
		return nil, false, fmt.Errorf("even the stub of the result is %d bytes, over --max-result-bytes %d", len(b), max)
	}
	return b, true, nil
}

// recorded decodes a recorded result (nil: none was recorded, as after a
// reconciliation).
func recorded(raw json.RawMessage) (*mcp.CallToolResult, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var rr recordedResult
	if err := json.Unmarshal(raw, &rr); err != nil || rr.Result == "" {
		return nil, fmt.Errorf("the recorded result is not mandate-mcp's (%.120s)", raw)
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal([]byte(rr.Result), &res); err != nil {
		return nil, fmt.Errorf("the recorded result does not decode: %w", err)
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	return &res, nil
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
