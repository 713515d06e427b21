package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What the relay's tail reads found that is not mandated's own chain:
// records another producer wrote (foreign), and records continuing the
// chain past PostgreSQL's last sequence. Each is reported — a metric, an
// error log line with where it is and who wrote it, and Ready — and never
// believed: the relay resumes only after records of its own chain, never
// past what PostgreSQL wrote.

// foreignKey identifies a record for reporting it once.
type foreignKey struct {
	topic  string
	offset int64
}

// foreignSeenMax bounds the records remembered per partition as reported
// (a flood of forgeries is counted again after that many).
const foreignSeenMax = 10000

// foreignLogMax bounds the log lines one tail read writes about foreign
// records; the rest are summed up in one line.
const foreignLogMax = 10

// tailStatus is what the last tail read of a partition found.
type tailStatus struct {
	at       time.Time
	foreign  []ForeignRecord
	lastSeq  int64 // PostgreSQL's last sequence
	aheadSeq int64 // the last sequence of the chain on Kafka past it (lastSeq when none)
}

// observe reports what a tail read found and keeps it for Ready.
func (r *Relay) observe(t *Tail) {
	p := t.Head.Partition
	log := r.log.With().Int32("partition", p).Logger()
	r.mu.Lock()
	seen := r.foreignSeen[p]
	if seen == nil || len(seen) > foreignSeenMax {
		seen = map[foreignKey]bool{}
		r.foreignSeen[p] = seen
	}
	var fresh []ForeignRecord
	for _, f := range t.Foreign {
		k := foreignKey{f.Topic, f.Offset}
		if !seen[k] {
			seen[k] = true
			fresh = append(fresh, f)
		}
	}
	prev := r.tails[p]
	if _, held := r.parts[p]; held {
		r.tails[p] = tailStatus{at: time.Now(), foreign: t.Foreign, lastSeq: t.Head.LastSeq, aheadSeq: t.AheadSeq}
	}
	r.mu.Unlock()

	if len(fresh) > 0 {
		r.metrics.ForeignRecords.WithLabelValues(strconv.Itoa(int(p))).Add(float64(len(fresh)))
	}
	for i, f := range fresh {
		if i == foreignLogMax {
			log.Error().Int("more", len(fresh)-i).Msg("more records another producer wrote on the partition (not logged one by one)")
			break
		}
		log.Error().Str("topic", f.Topic).Int64("offset", f.Offset).Int64("sequence", f.Seq).
			Int64("producer_id", f.ProducerID).Int16("producer_epoch", f.ProducerEpoch).Bool("transactional", f.Transactional).
			Str("why", f.Why).Int64("last_seq", t.Head.LastSeq).
			Msg("a record on the partition that mandated did not write (another producer has write access to the topic): never believed, the relay resumes after its own records only")
	}
	if t.State() == KafkaAhead && (prev.aheadSeq != t.AheadSeq || prev.lastSeq != t.Head.LastSeq) {
		log.Error().Int64("last_seq", t.Head.LastSeq).Int64("kafka_seq", t.AheadSeq).Int64("records", t.Behind()).
			Msg("Kafka holds records that continue the partition's chain past PostgreSQL's last sequence: PostgreSQL lost committed batches (a restored backup, a promoted asynchronous replica) or another writer knows the head; the relay publishes only what PostgreSQL holds")
	}
}

// Ready reports the partitions whose last tail read found records
// another producer wrote, or a chain past PostgreSQL's last sequence.
func (r *Relay) Ready(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	parts := make([]int32, 0, len(r.tails))
	for p := range r.tails {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var errs []error
	for _, p := range parts {
		st := r.tails[p]
		if st.aheadSeq > st.lastSeq {
			errs = append(errs, fmt.Errorf("partition %d: Kafka holds %d records past PostgreSQL's last sequence %d that continue its chain (did PostgreSQL go back in time?)",
				p, st.aheadSeq-st.lastSeq, st.lastSeq))
		}
		if len(st.foreign) == 0 {
			continue
		}
		var where []string
		for i, f := range st.foreign {
			if i == 3 {
				where = append(where, fmt.Sprintf("%d more", len(st.foreign)-i))
				break
			}
			where = append(where, fmt.Sprintf("%s offset %d sequence %d producer %d", f.Topic, f.Offset, f.Seq, f.ProducerID))
		}
		errs = append(errs, fmt.Errorf("partition %d: %d records another producer wrote (%s): never believed; see mandated_relay_foreign_records_total and the log",
			p, len(st.foreign), strings.Join(where, "; ")))
	}
	return errors.Join(errs...)
}

// checkLoop reads the tail of every partition the relay publishes every
// TailCheckInterval, to report what appeared since it resumed.
func (r *Relay) checkLoop() {
	t := time.NewTicker(r.cfg.TailCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stats:
			return
		case <-t.C:
		}
		r.mu.Lock()
		var parts []int32
		for p, ps := range r.parts {
			if ps.admitted && !ps.stopping {
				parts = append(parts, p)
			}
		}
		r.mu.Unlock()
		slices.Sort(parts)
		for _, p := range parts {
			if !r.gate.up(r.st.shard(p)) {
				continue // its shard does not answer: checked at its next resume
			}
			if _, err := r.readTail(r.ctx, p); err != nil && r.ctx.Err() == nil {
				if sh, ok := failedShard(err); ok {
					r.gate.failed(sh, "tail check", err)
				}
				r.log.Warn().Err(err).Int32("partition", p).Msg("periodic tail check failed; trying again at the next")
			}
		}
	}
}
