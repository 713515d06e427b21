// Package clock is the one clock the processor decides deadlines by. The
// real clock reads the system time; the fake one moves only when a test
// moves it, so a test can put a deadline exactly between two commands.
//
// It is a test seam, internal to the module: it must never import any
// package of mandated's (test/layout).
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer fires once on C unless stopped.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the system clock (UTC, monotonic readings stripped so times
// compare like the database's).
type Real struct{}

var _ Clock = Real{}

// Now returns the current UTC time.
func (Real) Now() time.Time { return time.Now().UTC().Round(0) }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when told to. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{now: t.UTC()} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Set moves the clock to t (forwards or backwards) and fires due timers.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.now = t.UTC()
	due := f.takeDue()
	f.mu.Unlock()
	for _, ft := range due {
		ft.ch <- t
	}
}

// Advance moves the clock forward by d.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

func (f *Fake) takeDue() []*fakeTimer {
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	var due []*fakeTimer
	for len(f.timers) > 0 && !f.timers[0].at.After(f.now) {
		due = append(due, f.timers[0])
		f.timers = f.timers[1:]
	}
	return due
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	t := &fakeTimer{f: f, at: f.now.Add(d), ch: make(chan time.Time, 1)}
	f.timers = append(f.timers, t)
	due := f.takeDue()
	f.mu.Unlock()
	for _, ft := range due {
		ft.ch <- ft.at
	}
	return t
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	ch chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}
