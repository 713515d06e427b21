package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// P3Config configures P3, the service a team would write by hand.
type P3Config struct {
	Brokers       []string `json:"brokers"`
	DatabaseURL   string   `json:"database_url"`
	In            string   `json:"in"`
	Out           string   `json:"out"`
	Group         string   `json:"group"`
	TransactionID string   `json:"transaction_id"`
	ValueBytes    int      `json:"value_bytes"`
	// StatsPath receives, at exit, what each Kafka request type cost
	// (map[string]ReqStat as JSON).
	StatsPath string `json:"stats_path"`
	// StagesPath receives, at exit, where its decisions waited
	// (P3StageStats as JSON); SIGUSR1 marks the measured part's start.
	StagesPath string `json:"stages_path"`
}

// P3StageStats is where P3's decisions waited: its stage histograms (the
// buckets of mandated's, keyed as ServeStats.Buckets) at SIGUSR1 and at
// exit, and its relay's transactions, for the visible stage.
type P3StageStats struct {
	Start map[string][]Bucket `json:"start,omitempty"`
	End   map[string][]Bucket `json:"end"`
	Txns  TxnCommits          `json:"txns"`
}

// p3Schema is P3's database: an idempotency row per record, a
// transactional outbox, and the consumed offsets.
const p3Schema = `
CREATE TABLE p3_idempotency (
    idempotency_key text PRIMARY KEY,
    partition       integer NOT NULL,
    source_offset   bigint  NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE p3_outbox (
    id         bigserial PRIMARY KEY,
    partition  integer NOT NULL,
    record_key bytea   NOT NULL,
    payload    bytea   NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE p3_offsets (
    topic       text    NOT NULL,
    partition   integer NOT NULL,
    next_offset bigint  NOT NULL,
    PRIMARY KEY (topic, partition)
);`

// p3InsertSQL stores one poll's records in one statement: an idempotency
// row per record, and an outbox row for each record whose key was new (a
// redelivered record answers nothing twice).
const p3InsertSQL = `WITH ins AS (
  INSERT INTO p3_idempotency (idempotency_key, partition, source_offset)
  SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[])
  ON CONFLICT DO NOTHING RETURNING idempotency_key)
INSERT INTO p3_outbox (partition, record_key, payload)
SELECT u.partition, u.record_key, u.payload
FROM unnest($1::text[], $2::int[], $4::bytea[], $5::bytea[]) WITH ORDINALITY AS u(idempotency_key, partition, record_key, payload, n)
JOIN ins USING (idempotency_key) ORDER BY u.n`

const p3OffsetsSQL = `INSERT INTO p3_offsets (topic, partition, next_offset)
SELECT $1, * FROM unnest($2::int[], $3::bigint[])
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset`

const p3LoadSQL = `SELECT id, partition, record_key, payload FROM p3_outbox ORDER BY id LIMIT 2000`

const p3DeleteSQL = `DELETE FROM p3_outbox WHERE id <= $1`

// P3 is the service a team would write by hand instead of mandated, doing
// the minimum the same guarantee needs: a franz-go group consumer whose
// offsets live in PostgreSQL (read back at assignment, never committed to
// Kafka), one PostgreSQL transaction per poll inserting an idempotency row
// and an outbox row per record together with the offsets, and a relay with
// a transactional producer that publishes the outbox in order and deletes
// what it published. It decodes each record's JSON for its idempotency key,
// as a real service would. The output value is the input padded to
// ValueBytes (a decision's size), so it echoes sent_at. No lifecycle, no
// fences, no chain: what mandated does beyond this is what it costs more.
// It prints "READY" once running and stops on SIGTERM; SIGUSR1 starts the
// measured part of its stage timings.
func P3(cfg P3Config) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	measure := make(chan struct{})
	go func() {
		select {
		case <-usr1:
			close(measure)
		case <-ctx.Done():
		}
	}()
	return runP3(ctx, cfg, measure)
}

// runP3 is P3 until ctx ends; its stage timings' measured part starts
// when measure is closed.
func runP3(ctx context.Context, cfg P3Config, measure <-chan struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	requests := newReqHook()
	stages, fetched, txns := newP3Stages(), newP3Fetched(), newTxnCommitLog()
	var stagesFrom atomic.Pointer[map[string][]Bucket]
	go func() {
		select {
		case <-measure:
			b := stages.buckets()
			stagesFrom.Store(&b)
		case <-ctx.Done():
		}
	}()
	defer func() {
		if cfg.StatsPath != "" {
			js, _ := json.Marshal(requests.snapshot())
			_ = os.WriteFile(cfg.StatsPath, js, 0o644)
		}
		if cfg.StagesPath != "" {
			st := P3StageStats{End: stages.buckets(), Txns: txns.snapshot()}
			if b := stagesFrom.Load(); b != nil {
				st.Start = *b
			}
			js, _ := json.Marshal(st)
			_ = os.WriteFile(cfg.StagesPath, js, 0o644)
		}
	}()
	cons, err := kgo.NewClient(
		kgo.WithHooks(requests, fetched),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.In),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.AdjustFetchOffsetsFn(func(ctx context.Context, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			return p3Offsets(ctx, pool, m)
		}),
		kgo.ClientID("bench-p3-consumer"),
	)
	if err != nil {
		return err
	}
	defer cons.Close()
	prod, err := kgo.NewClient(
		kgo.WithHooks(requests, newTxnClock(cfg.Out, txns)),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.TransactionalID(cfg.TransactionID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ClientID("bench-p3-relay"),
	)
	if err != nil {
		return err
	}
	defer prod.Close()

	wake := make(chan struct{}, 1)
	marks := &p3Marks{}
	var wg sync.WaitGroup
	relayErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := p3Relay(ctx, pool, prod, cfg.Out, wake, marks, stages); err != nil && ctx.Err() == nil {
			relayErr <- err
			cancel()
		}
	}()
	defer wg.Wait()

	fmt.Println("READY")
	var key struct {
		IdempotencyKey string `json:"idempotency_key"`
	}
	for ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachError(func(t string, p int32, err error) { fmt.Fprintf(os.Stderr, "fetch %s/%d: %v\n", t, p, err) })
		n := fs.NumRecords()
		if n == 0 {
			continue
		}
		start := time.Now() // the batch starts

		keys, parts, offs := make([]string, 0, n), make([]int32, 0, n), make([]int64, 0, n)
		rkeys, values := make([][]byte, 0, n), make([][]byte, 0, n)
		next := map[int32]int64{}
		fs.EachRecord(func(r *kgo.Record) {
			if at, ok := fetched.take(r); ok {
				stages[StageFetch].observe(at.Sub(r.Timestamp))
				stages[StageQueue].observe(start.Sub(at))
			}
			key.IdempotencyKey = ""
			if err := json.Unmarshal(r.Value, &key); err != nil || key.IdempotencyKey == "" {
				key.IdempotencyKey = fmt.Sprintf("%d/%d", r.Partition, r.Offset) // unreadable: keyed by position
			}
			v := make([]byte, len(r.Value), max(len(r.Value), cfg.ValueBytes))
			copy(v, r.Value)
			v = append(v, bytes.Repeat([]byte{' '}, cap(v)-len(v))...)
			keys, parts, offs = append(keys, key.IdempotencyKey), append(parts, r.Partition), append(offs, r.Offset)
			rkeys, values = append(rkeys, r.Key), append(values, v)
			next[r.Partition] = r.Offset + 1
		})
		var op []int32
		var oo []int64
		for p, o := range next {
			op, oo = append(op, p), append(oo, o)
		}
		// One round trip, one implicit transaction: both statements or
		// neither.
		var b pgx.Batch
		b.Queue(p3InsertSQL, keys, parts, offs, rkeys, values)
		b.Queue(p3OffsetsSQL, cfg.In, op, oo)
		br := pool.SendBatch(ctx, &b)
		tag, err := br.Exec()
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("store a poll of %d records: %w", n, err)
		}
		committed := time.Now()
		for range n {
			stages[StageCommit].observe(committed.Sub(start))
		}
		marks.committed(tag.RowsAffected(), committed)
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	cancel()
	select {
	case err := <-relayErr:
		return err
	default:
		return nil
	}
}

// p3Offsets points each assigned partition at the offset PostgreSQL
// stores for it (the start when it stores none).
func p3Offsets(ctx context.Context, pool *pgxpool.Pool, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	for topic, parts := range m {
		rows, err := pool.Query(ctx, `SELECT partition, next_offset FROM p3_offsets WHERE topic = $1`, topic)
		if err != nil {
			return nil, err
		}
		stored := map[int32]int64{}
		var p int32
		var o int64
		if _, err := pgx.ForEachRow(rows, []any{&p, &o}, func() error { stored[p] = o; return nil }); err != nil {
			return nil, err
		}
		for p := range parts {
			if o, ok := stored[p]; ok {
				parts[p] = kgo.NewOffset().At(o)
			} else {
				parts[p] = kgo.NewOffset().AtStart()
			}
		}
	}
	return m, nil
}

// p3Relay publishes the outbox in id order, one Kafka transaction per
// read, and deletes what a committed transaction carried. Woken by the
// consumer after each commit; it also looks every 100 ms.
func p3Relay(ctx context.Context, pool *pgxpool.Pool, prod *kgo.Client, topic string, wake <-chan struct{}, marks *p3Marks, stages p3Stages) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	type row struct {
		id         int64
		partition  int32
		key, value []byte
	}
	for {
		rows, err := pool.Query(ctx, p3LoadSQL)
		if err != nil {
			return err
		}
		var batch []row
		var r row
		if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.partition, &r.key, &r.value}, func() error {
			batch = append(batch, r)
			return nil
		}); err != nil {
			return err
		}
		loaded := time.Now()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-wake:
			case <-t.C:
			}
			continue
		}
		if err := prod.BeginTransaction(); err != nil {
			return err
		}
		var perr error
		var mu sync.Mutex
		for _, r := range batch {
			prod.Produce(ctx, &kgo.Record{Topic: topic, Partition: r.partition, Key: r.key, Value: r.value}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					perr = errors.Join(perr, err)
					mu.Unlock()
				}
			})
		}
		if err := prod.Flush(ctx); err != nil {
			return err
		}
		commit := kgo.TransactionEndTry(perr == nil)
		if err := prod.EndTransaction(ctx, commit); err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("publish: %w", perr)
		}
		published := time.Now()
		for _, r := range batch {
			stages[StageRelayWait].observe(loaded.Sub(marks.at(r.id, loaded)))
			stages[StageRelayTxn].observe(published.Sub(loaded))
		}
		marks.published(batch[len(batch)-1].id)
		if _, err := pool.Exec(ctx, p3DeleteSQL, batch[len(batch)-1].id); err != nil {
			return err
		}
	}
}

// p3Fetched notes when P3's consumer client buffered each record (the
// fetch stage's end: where mandated's poll loop hands a record to its
// worker, P3's client holds it until the next poll).
type p3Fetched struct {
	mu sync.Mutex
	at map[p3Pos]time.Time
}

type p3Pos struct {
	partition int32
	offset    int64
}

var _ kgo.HookFetchRecordBuffered = (*p3Fetched)(nil)

func newP3Fetched() *p3Fetched { return &p3Fetched{at: map[p3Pos]time.Time{}} }

func (f *p3Fetched) OnFetchRecordBuffered(r *kgo.Record) {
	now := time.Now()
	f.mu.Lock()
	f.at[p3Pos{r.Partition, r.Offset}] = now
	f.mu.Unlock()
}

// take returns when r was buffered, and forgets it.
func (f *p3Fetched) take(r *kgo.Record) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := p3Pos{r.Partition, r.Offset}
	at, ok := f.at[k]
	delete(f.at, k)
	return at, ok
}

// p3Marks notes when P3's transactions committed their outbox rows: one
// writer, so the outbox ids (a fresh bigserial, never rolled back) are
// the running count of rows committed.
type p3Marks struct {
	mu    sync.Mutex
	total int64
	marks [][2]int64 // [running count, commit time in Unix ns]
}

func (m *p3Marks) committed(rows int64, at time.Time) {
	if rows == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.total += rows
	m.marks = append(m.marks, [2]int64{m.total, at.UnixNano()})
}

// at is when the row id was committed; or, if its commit is not noted
// yet (the relay read it in between), def.
func (m *p3Marks) at(id int64, def time.Time) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.marks), func(i int) bool { return m.marks[i][0] >= id })
	if i == len(m.marks) {
		return def
	}
	return time.Unix(0, m.marks[i][1])
}

// published forgets the marks of rows up to id.
func (m *p3Marks) published(id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.marks), func(i int) bool { return m.marks[i][0] > id })
	m.marks = append(m.marks[:0], m.marks[i:]...)
}
