package processor

import (
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// recordNeeds adds what deciding a record (a recorded read, issue 42 item
// 4) needs besides its mandate, and reports whether c is one: its intent,
// whose recorded authorization the load joins in. A record names no
// authorization and binds no key.
func recordNeeds(needs *sink.Needs, c *wire.Command) bool {
	if c.Type != wire.CmdRecord {
		return false
	}
	if scope, ok := lifecycle.IntentScopeOf(c); ok {
		needs.Intents[scope] = struct{}{}
	}
	return true
}
