package processor

import (
	"context"
	"sync"
	"time"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// Signed grants: a grant, revoke or resolve may carry an Ed25519 signature
// by a grantor key registered for its org, and an org may require one.
// The processor checks it after decoding and before the state machine, so
// a principal that can write the grants topic but holds no key cannot mint
// authority, and the lifecycle never sees an unverified grantor command.

// keyring caches the grantor keys and signing settings read from
// PostgreSQL. Workers share it; a read older than the refresh interval is
// replaced before use, and a signature naming a key the cache does not
// know forces a reload (once per batch), so a key added a moment ago works
// at once. A revocation or a new "required" takes effect within the
// refresh interval.
type keyring struct {
	load    func(context.Context) (*sink.Keyring, error)
	refresh time.Duration

	mu     sync.Mutex
	ring   *sink.Keyring
	loaded time.Time // wall clock of the read
}

// get returns the keyring, reloading it if it is older than the refresh
// interval or if force is set.
func (k *keyring) get(ctx context.Context, force bool) (*sink.Keyring, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ring != nil && !force && time.Since(k.loaded) < k.refresh {
		return k.ring, nil
	}
	ring, err := k.load(ctx)
	if err != nil {
		return nil, err
	}
	k.ring, k.loaded = ring, time.Now()
	return ring, nil
}

// verifyCommand checks a signable command's signature against ring at now
// (lifecycle.VerifyGrantorSignature, which recovery checks with too). It
// returns the key id that signed it ("" for an accepted unsigned command),
// or the rejection that answers it. It is pure.
func verifyCommand(ring *sink.Keyring, cmd *wire.Command, now time.Time) (string, *wire.Rejection) {
	return lifecycle.VerifyGrantorSignature(ring, cmd, now)
}

// verifySignatures checks every signable command of a batch before it is
// decided: a refused one becomes a rejection, an accepted one remembers
// its signer for the decisions.
func (w *worker) verifySignatures(items []item, now time.Time) error {
	var signable []int
	for i := range items {
		if items[i].kind == itemCommand && items[i].cmd.Type.Signable() {
			signable = append(signable, i)
		}
	}
	if len(signable) == 0 {
		return nil
	}
	ring, err := w.keyring(false)
	if err != nil {
		return err
	}
	reloaded := false
	for _, i := range signable {
		it := &items[i]
		signer, rej := verifyCommand(ring, it.cmd, now)
		if rej != nil && rej.Reason == wire.ReasonSignatureUnknownKey && !reloaded {
			if ring, err = w.keyring(true); err != nil {
				return err
			}
			reloaded = true
			signer, rej = verifyCommand(ring, it.cmd, now)
		}
		if rej != nil {
			*it = w.p.reject(*it, it.cmd.Key, rej, -1)
			it.cmd = nil
			continue
		}
		it.signedBy = signer
	}
	return nil
}

// keyring returns the cached keyring, retrying a failed read with backoff
// until it succeeds or the worker stops: a grantor command is never
// decided without knowing whether its org requires a signature.
func (w *worker) keyring(force bool) (*sink.Keyring, error) {
	retry := backoff.New(50*time.Millisecond, 5*time.Second)
	for {
		ring, err := w.p.keys.get(w.ctx, force)
		if err == nil {
			return ring, nil
		}
		if w.ctx.Err() != nil {
			return nil, errStopped
		}
		w.log.Error().Err(err).Dur("backoff", retry.Current()).Msg("cannot read the grantor keys; retrying")
		if !retry.Wait(w.ctx) {
			return nil, errStopped
		}
	}
}
