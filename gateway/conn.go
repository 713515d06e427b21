package gateway

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/mandated/mandated/wire"
)

// Serve serves hs on ln: over TLS when hs.TLSConfig is set (HTTP/1.1; a
// certificate from hs.TLSConfig.Certificates or GetCertificate), and with
// every answer net/http writes before a handler runs (431 for oversized
// headers, 400 for a NUL in a header or a malformed request line, 501 for
// an unknown transfer coding, 505) turned into a problem details object
// like every other error of the API. It returns when hs is shut down.
func (s *Server) Serve(hs *http.Server, ln net.Listener) error {
	if hs.TLSConfig != nil {
		cfg := hs.TLSConfig.Clone()
		// HTTP/1.1 only: the connections below are wrapped, and net/http
		// serves HTTP/2 only on a bare *tls.Conn.
		cfg.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, cfg)
	}
	return hs.Serve(problemListener{ln})
}

// problemListener wraps every accepted connection in a problemConn.
type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c}, nil
}

// problemConn rewrites net/http's own error answers. net/http writes them
// straight to the connection, in one Write, as a whole response: a status
// line, "Content-Type: text/plain; charset=utf-8" and "Connection: close",
// and a short text. Every answer of the API's handlers has a JSON (or
// YAML) Content-Type and the console's pages are text/html, so a complete
// header block with a 4xx or 5xx status and a text/plain Content-Type is
// one of those and nothing else.
//
// net/http's plain "400 Bad Request" does not say why; the connection
// notes whether what it read since its last answer held a control
// character (a NUL in a header: net/textproto refuses the line), so that
// one is header_invalid rather than malformed_request.
type problemConn struct {
	net.Conn
	sawControl atomic.Bool
}

func (c *problemConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	for _, b := range p[:n] {
		if b < 0x20 && b != '\t' && b != '\r' && b != '\n' || b == 0x7f {
			c.sawControl.Store(true)
			break
		}
	}
	return n, err
}

func (c *problemConn) Write(p []byte) (int, error) {
	if out, ok := rewriteServerError(p, c.sawControl.Load()); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	c.sawControl.Store(false)
	return c.Conn.Write(p)
}

func rewriteServerError(p []byte, sawControl bool) ([]byte, bool) {
	if !bytes.HasPrefix(p, []byte("HTTP/1.1 ")) || len(p) < 12 || (p[9] != '4' && p[9] != '5') {
		return nil, false
	}
	end := bytes.Index(p, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false
	}
	head := string(p[:end])
	if !strings.Contains(strings.ToLower(head), "\r\ncontent-type: text/plain") {
		return nil, false
	}
	line, _, _ := strings.Cut(head, "\r\n")
	code, err := strconv.Atoi(line[9:12])
	if err != nil {
		return nil, false
	}
	text := strings.TrimSpace(string(p[end+4:]))
	reason := ReasonMalformedRequest
	switch {
	case code == http.StatusRequestHeaderFieldsTooLarge:
		reason = ReasonHeadersTooLarge
	case strings.Contains(text, "header"):
		reason = wire.ReasonHeaderInvalid
	case code == http.StatusBadRequest && sawControl:
		reason, text = wire.ReasonHeaderInvalid, text+": the request head holds a control character (a NUL in a header?)"
	}
	body, _ := json.Marshal(Problem{
		Type: "urn:mandated:reason:" + string(reason), Title: http.StatusText(code), Status: code,
		Detail: "net/http refused the request before the gateway read it: " + text, Reason: reason,
	})
	body = append(body, '\n')
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		code, http.StatusText(code), len(body), body), true
}
