package shardmap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// MapLock is an exclusive lock on a shard map file, held by one editor
// (mandatectl shards move, repartition) from its first read of the map to
// its write: two edits never start from the same content, so neither is
// lost. It is an flock(2) on a lock file beside the map (<map>.lock), so the
// kernel releases it when its holder dies, however it dies; the file itself
// stays (removing it would race with the next editor that opened it).
type MapLock struct {
	f    *os.File
	path string
}

// LockPoll is how often Lock tries again while another editor
// holds the lock.
const LockPoll = 50 * time.Millisecond

// LockPath is the lock file of the shard map at path.
func LockPath(path string) string { return path + ".lock" }

// Lock takes the lock of the shard map file at path, waiting while
// another editor holds it (waiting, when not nil, is called once with what
// the holder wrote in the lock file) until ctx ends. Once it holds the
// lock it removes the temporary files an editor killed before its rename
// left beside the map (WriteFileAtomic): only a lock holder writes them.
func Lock(ctx context.Context, path string, waiting func(holder string)) (*MapLock, error) {
	lp := LockPath(path)
	f, err := os.OpenFile(lp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sink: open the shard map's lock file %s: %w", lp, err)
	}
	var tick *time.Ticker
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("sink: lock the shard map (%s): %w", lp, err)
		}
		if tick == nil {
			tick = time.NewTicker(LockPoll)
			defer tick.Stop()
			if waiting != nil {
				holder, _ := os.ReadFile(lp)
				waiting(strings.TrimSpace(string(holder)))
			}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("sink: wait for the shard map's lock %s: %w", lp, ctx.Err())
		case <-tick.C:
		}
	}
	l := &MapLock{f: f, path: path}
	host, _ := os.Hostname()
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(fmt.Appendf(nil, "pid %d on %s since %s: %s\n", os.Getpid(), host,
			time.Now().UTC().Format(time.RFC3339), RedactSecrets(strings.Join(os.Args, " "))), 0)
	}
	l.removeStaleTemps()
	return l, nil
}

// Unlock releases the lock.
func (l *MapLock) Unlock() error {
	_ = l.f.Truncate(0)
	err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeStaleTemps removes the ".<map>.<digits>" files beside the map: the
// temporary files of WriteFileAtomic and CheckWritable (os.CreateTemp puts
// digits for its "*"), left only by an editor that died holding the lock
// (a copy of the map, secrets included).
func (l *MapLock) removeStaleTemps() {
	dir, prefix := filepath.Dir(l.path), "."+filepath.Base(l.path)+"."
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		suffix, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || suffix == "" || e.IsDir() || strings.Trim(suffix, "0123456789") != "" {
			continue
		}
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
}
