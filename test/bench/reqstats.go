package bench

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ReqStat is what one Kafka request type cost a process: how many were
// answered, their round trips (conn.Write to the response read, i.e.
// without the time queued in the client), the time they waited in the
// client before being written, and a log₂ histogram of the round trips
// in milliseconds (bucket i counts trips under 2^i ms, the last one the
// rest).
type ReqStat struct {
	Count     uint64     `json:"count"`
	Seconds   float64    `json:"seconds"`
	WaitSecs  float64    `json:"write_wait_seconds"`
	MaxMS     float64    `json:"max_ms"`
	Histogram [14]uint64 `json:"log2_ms_histogram"`
}

// Sub returns s - o (Max is s's).
func (s ReqStat) Sub(o ReqStat) ReqStat {
	d := ReqStat{Count: s.Count - o.Count, Seconds: s.Seconds - o.Seconds, WaitSecs: s.WaitSecs - o.WaitSecs, MaxMS: s.MaxMS}
	for i := range s.Histogram {
		d.Histogram[i] = s.Histogram[i] - o.Histogram[i]
	}
	return d
}

// MeanMS is the mean round trip.
func (s ReqStat) MeanMS() float64 {
	if s.Count == 0 {
		return 0
	}
	return s.Seconds / float64(s.Count) * 1000
}

// QuantileMS is the upper bound of the histogram bucket holding quantile
// q (0–1) of the round trips.
func (s ReqStat) QuantileMS(q float64) float64 {
	want := uint64(math.Ceil(q * float64(s.Count)))
	var n uint64
	for i, c := range s.Histogram {
		n += c
		if n >= want && n > 0 {
			if i == len(s.Histogram)-1 {
				return s.MaxMS // the last bucket is open-ended
			}
			return math.Pow(2, float64(i))
		}
	}
	return s.MaxMS
}

// reqHook collects ReqStat per request name for every client of a process.
type reqHook struct {
	mu    sync.Mutex
	stats map[string]ReqStat
}

var _ kgo.HookBrokerE2E = (*reqHook)(nil)

func newReqHook() *reqHook { return &reqHook{stats: map[string]ReqStat{}} }

func (h *reqHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if e2e.Err() != nil {
		return
	}
	rt := e2e.DurationE2E()
	name := kmsg.NameForKey(key)
	ms := float64(rt) / float64(time.Millisecond)
	i := 0
	for i < 13 && ms >= math.Pow(2, float64(i)) {
		i++
	}
	h.mu.Lock()
	s := h.stats[name]
	s.Count++
	s.Seconds += rt.Seconds()
	s.WaitSecs += e2e.WriteWait.Seconds()
	s.MaxMS = max(s.MaxMS, ms)
	s.Histogram[i]++
	h.stats[name] = s
	h.mu.Unlock()
}

func (h *reqHook) snapshot() map[string]ReqStat {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]ReqStat, len(h.stats))
	for k, v := range h.stats {
		out[k] = v
	}
	return out
}

// subReqs returns end - start per request name.
func subReqs(end, start map[string]ReqStat) map[string]ReqStat {
	out := map[string]ReqStat{}
	for k, v := range end {
		if d := v.Sub(start[k]); d.Count > 0 {
			out[k] = d
		}
	}
	return out
}

// reqNames returns the request names of m, most total time first.
func reqNames(m map[string]ReqStat) []string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return m[names[i]].Seconds > m[names[j]].Seconds })
	return names
}

// retryLogger counts franz-go's debug messages about retries and
// CONCURRENT_TRANSACTIONS, by message and request (a diagnosis aid: debug
// logging costs CPU, so it is on only with ServeConfig.RelayRetryLog).
type retryLogger struct {
	mu     sync.Mutex
	counts map[string]uint64
}

func newRetryLogger() *retryLogger { return &retryLogger{counts: map[string]uint64{}} }

func (l *retryLogger) Level() kgo.LogLevel { return kgo.LogLevelDebug }

func (l *retryLogger) Log(_ kgo.LogLevel, msg string, kv ...any) {
	// The sink's per-request debug line lists each partition it will
	// retry as "retrying@<offset>,<records>(<error>)".
	for _, v := range kv {
		str, ok := v.(string)
		if !ok {
			continue
		}
		for {
			i := strings.Index(str, "retrying@")
			if i < 0 {
				break
			}
			str = str[i+len("retrying@"):]
			if j, k := strings.IndexByte(str, '('), strings.IndexByte(str, ')'); j >= 0 && k > j {
				l.mu.Lock()
				l.counts["produce partition retried: "+str[j+1:k]]++
				l.mu.Unlock()
			}
		}
	}
	if !strings.Contains(msg, "retry") && !strings.Contains(msg, "retrying") && !strings.Contains(msg, "CONCURRENT") &&
		!strings.Contains(msg, "backoff") {
		return
	}
	key := msg
	for i := 0; i+1 < len(kv); i += 2 {
		if k, _ := kv[i].(string); k == "request" || k == "response_error" {
			key += fmt.Sprintf(" %s=%v", k, kv[i+1])
		}
	}
	if len(key) > 160 {
		key = key[:160]
	}
	l.mu.Lock()
	l.counts[key]++
	l.mu.Unlock()
}

func (l *retryLogger) snapshot() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]uint64, len(l.counts))
	for k, v := range l.counts {
		out[k] = v
	}
	return out
}
