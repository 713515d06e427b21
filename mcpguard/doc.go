// Package mcpguard puts a mandate in front of the tools of one upstream MCP
// server: it is an MCP server (stdio or streamable HTTP) that lists the
// upstream's tools with their schemas, passes the unguarded ones through
// unchanged, and runs each call of a guarded tool (Rules) as seed 002's
// protocol through package client: propose and wait for the decision,
// begin as a new executor, forward the call, commit with the upstream's
// result as the recorded result. Every repeat of the same intent, and every
// concurrent copy of the call, gets that recorded result without the
// upstream being called again; a denial is a tool error (isError) naming
// the reason and the decision id; an outcome that cannot be known is
// reported unknown and answered as an in-doubt tool error for an operator.
// A tool the rules mark recorded is a read: its first answer per intent is
// recorded (mandated's record command) and every repeat gets it, with no
// authority taken.
//
// It is a caller, like the gateway: it produces commands and reads
// decisions through package client and never decides anything itself. It
// must never import the processor, the sink or the state machine, and it
// holds no state of its own that a restart could lose: what a call needs
// to be answered again lives in mandated.
package mcpguard
