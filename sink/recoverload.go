package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/wire"
)

// What recovery re-decides on. mandatectl recover (verify.Recover)
// re-decides the inputs the decisions past a restored database's head say
// they answer, through the same machine, from the state that database
// holds: it loads what each input needs (AddCommand, the batch's own
// Needs) with the batch's own statements, into a working state that it
// changes as it decides and that stays ahead of the database (LoadInto
// never replaces what it holds).

// AddCommand adds what deciding c at now needs, as a batch loads it: its
// mandate, its idempotency key and intent (a record's intent alone), the
// authorization it names (or every reserved and in-doubt one of a mandate
// it revokes), and, for a proposal without an intent of an org with a
// possible-replay window (replay), the mandate's recent committed and
// executing authorizations.
func (n *Needs) AddCommand(c *wire.Command, replay lifecycle.ReplaySetting, now time.Time) {
	n.Mandates[c.Key] = struct{}{}
	if scope, ok := lifecycle.ScopeOf(c); ok {
		n.Idem[scope] = struct{}{}
	}
	if c.Type == wire.CmdRecord {
		// A recorded read (issue 42 item 4): its intent, whose recorded
		// authorization the load joins in; it names no authorization.
		if scope, ok := lifecycle.IntentScopeOf(c); ok {
			n.Intents[scope] = struct{}{}
		}
		return
	}
	if c.Type == wire.CmdPropose {
		if scope, ok := lifecycle.IntentScopeOf(c); ok {
			n.Intents[scope] = struct{}{}
		} else {
			n.Replay[c.Key.Org] = replay
			if replay.Window > 0 {
				since := now.Add(-replay.Window)
				if t, ok := n.Recent[c.Key]; !ok || since.Before(t) {
					n.Recent[c.Key] = since
				}
			}
		}
	}
	switch c.Type {
	case wire.CmdPropose, wire.CmdGrant:
	case wire.CmdRevoke:
		n.Reserved[c.Key] = struct{}{}
	default:
		n.Auths[lifecycle.AuthKey{Mandate: c.Key, ID: c.AuthorizationID()}] = struct{}{}
	}
}

// AddDeadline adds what applying an authorization's deadline needs.
func (n *Needs) AddDeadline(k lifecycle.AuthKey) {
	n.Mandates[k.Mandate] = struct{}{}
	n.Auths[k] = struct{}{}
}

// LoadInto reads what needs names from the database q reaches, in one
// snapshot, and adds to st every row st does not hold yet: st's own rows
// (changed since, or new) are never replaced.
func LoadInto(ctx context.Context, q pgx.Tx, needs Needs, st *lifecycle.State) error {
	tmp := lifecycle.NewState(st.Partition, st.Epoch, st.NextSeq, st.Retention)
	tids := newRowTIDs()
	var lb pgx.Batch
	var orgs, ids []string
	for k := range needs.Mandates {
		orgs, ids = append(orgs, k.Org), append(ids, k.MandateID)
	}
	lb.Queue(loadMandatesSQL, orgs, ids)
	var iOrgs, iMids, iOps, iKeys []string
	for k := range needs.Idem {
		iOrgs, iMids, iOps, iKeys = append(iOrgs, k.Org), append(iMids, k.MandateID), append(iOps, k.Operation), append(iKeys, k.Key)
	}
	lb.Queue(loadIdemSQL, iOrgs, iMids, iOps, iKeys)
	intents := queueLoadIntents(&lb, needs)
	auths := queueLoadAuths(&lb, needs)
	recent := queueLoadRecent(&lb, needs)
	br := q.SendBatch(ctx, &lb)
	err := func() error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			m, err := scanMandate(rows, new(any))
			if err != nil {
				rows.Close()
				return err
			}
			tmp.Mandates[m.Key] = m
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		for rows.Next() {
			r, err := scanIdem(rows)
			if err != nil {
				rows.Close()
				return err
			}
			tmp.Idem[r.Scope] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if intents {
			if err := loadIntents(br, tmp, &tids); err != nil {
				return err
			}
		}
		if auths {
			if err := readAuths(br, tmp, &tids); err != nil {
				return err
			}
		}
		if recent {
			if err := readRecent(br, tmp, &tids); err != nil {
				return err
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sink: load what recovery re-decides on: %w", interpretError(err))
	}
	for k, m := range tmp.Mandates {
		if _, ok := st.Mandates[k]; !ok {
			st.Mandates[k] = m
		}
	}
	for k, a := range tmp.Auths {
		if _, ok := st.Auths[k]; !ok {
			st.Auths[k] = a
		}
	}
	for k, r := range tmp.Idem {
		if _, ok := st.Idem[k]; !ok {
			st.Idem[k] = r
		}
	}
	for k, r := range tmp.Intents {
		if _, ok := st.Intents[k]; !ok {
			st.Intents[k] = r
		}
	}
	return nil
}

// OrgSettings are the per-org settings decisions depend on: the
// idempotency retention (keys' and intents' expiry) and the possible-replay
// setting, as org_settings holds them.
type OrgSettings struct {
	Retention map[string]time.Duration
	Replay    map[string]lifecycle.ReplaySetting
}

// ReadOrgSettings reads every org's retention and replay settings (the
// control shard's).
func ReadOrgSettings(ctx context.Context, q KeyQuerier) (OrgSettings, error) {
	out := OrgSettings{Retention: map[string]time.Duration{}, Replay: map[string]lifecycle.ReplaySetting{}}
	rows, err := q.Query(ctx, `SELECT org, extract(epoch FROM idempotency_retention)::float8, extract(epoch FROM replay_window)::float8,
		coalesce(replay_policy, '') FROM org_settings`)
	if err != nil {
		return out, fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	var org, policy string
	var retention, window *float64
	_, err = pgx.ForEachRow(rows, []any{&org, &retention, &window, &policy}, func() error {
		if retention != nil {
			out.Retention[org] = time.Duration(*retention * float64(time.Second))
		}
		if window != nil {
			out.Replay[org] = lifecycle.ReplaySetting{Window: time.Duration(*window * float64(time.Second)), Policy: lifecycle.ReplayPolicy(policy)}
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	return out, nil
}
