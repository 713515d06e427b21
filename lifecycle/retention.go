package lifecycle

import (
	"fmt"

	"github.com/mandated/mandated/wire"
)

// windowsOutlastRetention refuses a grant whose hold window plus execution
// timeout are longer than the org's idempotency-key retention, and reports
// whether it did. An authorization can be reserved for the hold window and
// then execute for the execution timeout; its key must be kept at least as
// long, so that the same intent sent again meanwhile is replayed and never
// reserved a second time.
func (d *decider) windowsOutlastRetention(g *wire.Grant) bool {
	retention := d.st.Retention(d.cmd.Key.Org)
	if g.HoldWindow+g.ExecutionTimeout <= retention {
		return false
	}
	d.answer(wire.OutcomeRefused, wire.ReasonWindowsExceedRetention,
		fmt.Sprintf("hold window %s + execution timeout %s outlast the org's idempotency-key retention %s; shorten them or raise the retention",
			g.HoldWindow, g.ExecutionTimeout, retention))
	return true
}
