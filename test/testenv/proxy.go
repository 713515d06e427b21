package testenv

import (
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections to one server, for a test that must cut a
// single client off it (one process from PostgreSQL while the others and
// Kafka stay reachable). Cut behaves like a network partition: open
// connections go silent (bytes are swallowed, nothing answers) and new
// ones are accepted and then ignored; Restore closes those and forwards
// again.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy listens on a free local port and forwards to target
// (host:port). It stops at the test's cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{t: t, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL (a postgres:// URL) with its host replaced by the proxy.
func (p *Proxy) URL(rawURL string) string {
	u, err := url.Parse(rawURL)
	require.NoError(p.t, err)
	u.Host = p.Addr()
	return u.String()
}

// Retarget sends new connections to target (host:port) and drops the open
// ones, as a failover moving a virtual address to a promoted replica does.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Cut silences every connection, open and new.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

// Restore drops the connections opened or silenced during the cut (their
// clients see them fail and reconnect) and forwards new ones again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *Proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *Proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if p.isCut() {
			continue // held open, never answered, closed by Restore
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(up)
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies from→to while not cut; during a cut it swallows what arrives.
func (p *Proxy) pipe(from, to net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				_ = from.Close()
				return
			}
		}
		if err != nil {
			_ = to.Close()
			p.mu.Lock()
			delete(p.conns, from)
			p.mu.Unlock()
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}
