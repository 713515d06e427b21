package testenv

import (
	"sync"
	"testing"
	"time"
)

// Tick calls f(0), f(1), … every `every` (as fast as it returns when every
// is 0) on a goroutine of its own, until the returned stop is called, which
// waits for the call in progress; the test's cleanup stops it too. Load
// generators in tests use it instead of a ticker loop each.
func Tick(t testing.TB, every time.Duration, f func(i int)) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		var tick <-chan time.Time
		if every > 0 {
			tk := time.NewTicker(every)
			defer tk.Stop()
			tick = tk.C
		}
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if tick != nil {
				select {
				case <-done:
					return
				case <-tick:
				}
			}
			f(i)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); <-ended }) }
	t.Cleanup(stop)
	return stop
}
