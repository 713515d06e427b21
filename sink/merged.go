package sink

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
)

// A merged group commit loads what every part needs with one statement per
// table (the union of the parts' needs) and hands each row to the parts
// that asked for it: a mandate to the part whose partition it lives on (the
// parts' mandates are disjoint: a mandate lives on one partition, and a
// record that arrived elsewhere is rejected before it needs anything), an
// idempotency key or an intent to every part that looks it up (one key can
// be proposed on two partitions at once), an authorization to the part of
// its mandate and to every part whose loaded keys and intents point at it.

// mergedLoads is what queueMergedLoads queued, and who asked for what.
type mergedLoads struct {
	intents, auths, recent bool

	mandates map[partitioner.MandateKey]int // the part of each mandate
	idem     map[lifecycle.IdemScope][]int
	intent   map[lifecycle.IntentScope][]int
}

// queueMergedLoads queues phase one's loads for every part at once.
func queueMergedLoads(lb *pgx.Batch, parts []*batchPart) mergedLoads {
	all := NewNeeds()
	l := mergedLoads{mandates: map[partitioner.MandateKey]int{}, idem: map[lifecycle.IdemScope][]int{},
		intent: map[lifecycle.IntentScope][]int{}}
	for j, p := range parts {
		n := p.b.Needs
		for k := range n.Mandates {
			all.Mandates[k] = struct{}{}
			l.mandates[k] = j
		}
		for k := range n.Idem {
			all.Idem[k] = struct{}{}
			l.idem[k] = append(l.idem[k], j)
		}
		for k := range n.Intents {
			all.Intents[k] = struct{}{}
			l.intent[k] = append(l.intent[k], j)
		}
		for k := range n.Auths {
			all.Auths[k] = struct{}{}
		}
		for k := range n.Reserved {
			all.Reserved[k] = struct{}{}
		}
		for k, t := range n.Recent {
			if since, ok := all.Recent[k]; !ok || t.Before(since) {
				all.Recent[k] = t
			}
		}
	}
	var orgs, ids []string
	for k := range all.Mandates {
		orgs, ids = append(orgs, k.Org), append(ids, k.MandateID)
	}
	lb.Queue(loadMandatesSQL, orgs, ids)
	var iOrgs, iMids, iOps, iKeys []string
	for k := range all.Idem {
		iOrgs, iMids = append(iOrgs, k.Org), append(iMids, k.MandateID)
		iOps, iKeys = append(iOps, k.Operation), append(iKeys, k.Key)
	}
	lb.Queue(loadIdemSQL, iOrgs, iMids, iOps, iKeys)
	l.intents = queueLoadIntents(lb, all)
	l.auths = queueLoadAuths(lb, all)
	l.recent = queueLoadRecent(lb, all)
	return l
}

// readLocks reads lockPartitionsSQL's rows and checks each part's fence
// (see readLock).
func readLocks(br pgx.BatchResults, parts []*batchPart) error {
	type lockRow struct {
		epoch  int64
		stored Position
		head   []byte
	}
	found := map[int32]lockRow{}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("lock partitions: %w", err)
	}
	for rows.Next() {
		var p int32
		var r lockRow
		var planning string
		if err := rows.Scan(&p, &r.epoch, &r.stored.ProposalsOffset, &r.stored.GrantsOffset, &r.stored.NextSeq, &r.head, &planning); err != nil {
			rows.Close()
			return fmt.Errorf("lock partitions: %w", err)
		}
		found[p] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lock partitions: %w", err)
	}
	for _, p := range parts {
		r, ok := found[p.b.Partition]
		p.stored, p.head = r.stored, r.head
		p.checkFence(ok, r.epoch)
	}
	return nil
}

// readMergedLoads reads what queueMergedLoads queued into the state of
// every part still going (not fenced, not already stored).
func (s *Sink) readMergedLoads(br pgx.BatchResults, parts []*batchPart, l mergedLoads) error {
	live := func(j int) bool { return parts[j].fence == nil && !parts[j].already }
	for j, p := range parts {
		if live(j) {
			st := lifecycle.NewState(p.b.Partition, p.b.Epoch, p.stored.NextSeq, s.Retention)
			st.Replay = p.b.Needs.Replay
			p.st, p.tids = st, newRowTIDs()
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("load mandates: %w", err)
	}
	for rows.Next() {
		var tid pgtype.TID
		m, err := scanMandate(rows, &tid)
		if err != nil {
			rows.Close()
			return fmt.Errorf("load mandates: %w", err)
		}
		if j, ok := l.mandates[m.Key]; ok && live(j) {
			parts[j].st.Mandates[m.Key] = m
			parts[j].tids.mandates[m.Key] = tid
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load mandates: %w", err)
	}
	// An authorization is wanted by the part of its mandate and by the
	// parts whose keys and intents point at it.
	want := map[lifecycle.AuthKey][]int{}
	if rows, err = br.Query(); err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	for rows.Next() {
		r, err := scanIdem(rows)
		if err != nil {
			rows.Close()
			return fmt.Errorf("load idempotency keys: %w", err)
		}
		for _, j := range l.idem[r.Scope] {
			if live(j) {
				c := *r
				parts[j].st.Idem[r.Scope] = &c
				if r.AuthorizationID != "" {
					k := lifecycle.AuthKey{Mandate: r.Mandate, ID: r.AuthorizationID}
					want[k] = append(want[k], j)
				}
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	if l.intents {
		if rows, err = br.Query(); err != nil {
			return fmt.Errorf("load intents: %w", err)
		}
		for rows.Next() {
			var tid pgtype.TID
			r, err := scanIntent(rows, &tid)
			if err != nil {
				rows.Close()
				return fmt.Errorf("load intents: %w", err)
			}
			for _, j := range l.intent[r.Scope] {
				if live(j) {
					c := *r
					parts[j].st.Intents[r.Scope] = &c
					parts[j].tids.intents[r.Scope] = tid
					want[r.Head] = append(want[r.Head], j)
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("load intents: %w", err)
		}
	}
	give := func(a *lifecycle.Authorization, tid pgtype.TID, keep bool) {
		js := want[a.Key]
		if j, ok := l.mandates[a.Key.Mandate]; ok {
			js = append(js, j)
		}
		for _, j := range js {
			if !live(j) {
				continue
			}
			st := parts[j].st
			if _, loaded := st.Auths[a.Key]; loaded && keep {
				continue
			}
			c := *a
			st.Auths[a.Key] = &c
			parts[j].tids.auths[a.Key] = tid
		}
	}
	if l.auths {
		if err := readAuthRows(br, func(a *lifecycle.Authorization, tid pgtype.TID) { give(a, tid, false) }); err != nil {
			return fmt.Errorf("load authorizations: %w", err)
		}
	}
	if l.recent {
		// An authorization already loaded keeps its loaded copy.
		if err := readAuthRows(br, func(a *lifecycle.Authorization, tid pgtype.TID) { give(a, tid, true) }); err != nil {
			return fmt.Errorf("load recent authorizations: %w", err)
		}
	}
	return nil
}

// readAuthRows reads a result of authorization rows with their addresses.
func readAuthRows(br pgx.BatchResults, f func(*lifecycle.Authorization, pgtype.TID)) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var tid pgtype.TID
		a, err := scanAuth(rows, &tid)
		if err != nil {
			return err
		}
		f(a, tid)
	}
	return rows.Err()
}

// checkFence checks the part's fence against its partition row (found, at
// epoch; p.stored read from it): p.fence, or p.already when an earlier
// attempt's ambiguous COMMIT did commit.
func (p *batchPart) checkFence(found bool, epoch int64) {
	b := p.b
	switch {
	case !found:
		p.fence = fmt.Errorf("%w: partition %d has never been claimed", ErrFenced, b.Partition)
	case epoch != b.Epoch:
		p.fence = fmt.Errorf("%w: partition %d is at epoch %d, this owner holds %d", ErrFenced, b.Partition, epoch, b.Epoch)
	case p.stored != b.From:
		if p.stored.ProposalsOffset == b.To.ProposalsOffset && p.stored.GrantsOffset == b.To.GrantsOffset && p.retried {
			// An earlier attempt committed; its acknowledgement was lost.
			p.already = true
		} else {
			p.fence = fmt.Errorf("%w: partition %d stores position %+v, this owner expected %+v", ErrFenced, b.Partition, p.stored, b.From)
		}
	}
}
