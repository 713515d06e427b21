package testenv

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// The two tiers of the suite (docs/tests.md): `make test-short` runs
// `go test -short`, the everyday loop; `make test` runs everything. A
// package whose every test starts real processes, private servers or a
// timed soak (test/fault, test/e2e, test/deploy, ...) is the full tier's
// alone and calls SkipPackageInShortTier from its TestMain.

// SkipPackageInShortTier ends the test binary with success, saying so and
// why, when the tests run with -short; otherwise it returns and TestMain
// goes on to m.Run.
func SkipPackageInShortTier(why string) {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		fmt.Printf("skipped in the short tier (-short): %s; make test runs it\n", why)
		os.Exit(0)
	}
}

// SkipInShortTier skips t under -short, saying why: a test that costs what
// the everyday loop cannot afford (a private server started and stopped,
// another language's packages installed, a browser driven, a long
// multi-process run). Tests the short tier keeps are the Go code against the
// shared test servers.
func SkipInShortTier(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("skipped in the short tier (-short): %s; make test runs it", why)
	}
}
