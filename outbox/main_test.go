package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a component starts is owned by a lifecycle its Stop waits for.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
