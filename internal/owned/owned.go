// Package owned keeps the goroutines a component starts: each runs in a
// Group that the component's Stop waits for, within Stop's context, so
// that nothing it started outlives it.
//
// It exists beside sync.WaitGroup because a component's goroutines start
// other goroutines at any time (a fenced worker starts its successor, a
// worker asks for a session restart) while Stop may already be waiting: a
// WaitGroup forbids an Add from zero during a Wait, and its Wait ignores a
// deadline. It must never start a goroutine the caller did not ask for.
package owned

import (
	"context"
	"sync"
)

// Group is a set of running goroutines. The zero value is ready to use.
type Group struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n == 0
}

// Go runs f in a goroutine of the group.
func (g *Group) Go(f func()) {
	g.mu.Lock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer g.done()
		f()
	}()
}

func (g *Group) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n == 0 {
		close(g.idle)
		g.idle = nil
	}
}

// Running returns how many goroutines of the group run.
func (g *Group) Running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Wait waits until no goroutine of the group runs (one started while it
// waits is waited for too), or until ctx ends: it then returns ctx's
// error, and the goroutines still running go on.
func (g *Group) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		idle := g.idle
		g.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
