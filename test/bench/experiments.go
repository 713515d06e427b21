package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Experiment is one A/B comparison of PostgreSQL alone replaying the batch
// SQL (P2), interleaved like the main bench.
type Experiment struct {
	Name   string    `json:"name"`
	A, B   string    `json:"-"`
	ATPS   []float64 `json:"a_tps"`
	BTPS   []float64 `json:"b_tps"`
	Ratios []float64 `json:"b_over_a"`
	Median float64   `json:"median_b_over_a"`
	Note   string    `json:"note"`
}

// runExperiments answers three questions about the misses with PostgreSQL
// alone (no Kafka, no mandated): what the guard triggers cost, whether the
// 1 M-mandate slowdown is PostgreSQL's own, and what WAL compression does
// to it. It needs no broker. Results go to <results>/<date>-experiments/.
func (b *Bench) runExperiments(ctx context.Context) error {
	c := b.cfg
	batch := 500
	payload := []byte(strings.Repeat(`{"v":1,"decision_id":"3-1042","outcome":"reserved"}`, 21))
	type setup struct{ name, template, p2tpl, script string }
	mk := func(name string, m int) (setup, error) {
		s := setup{name: name, template: fmt.Sprintf("tpl_p%d_m%d", c.Partitions, m), p2tpl: "p2tpl_" + name,
			script: filepath.Join(b.work, "p2-"+name+".sql")}
		t := time.Now()
		if err := b.pg.makeTemplate(ctx, s.template, c.Partitions, m); err != nil {
			return s, err
		}
		if err := b.setupP2(ctx, s.template, s.p2tpl, c.Partitions); err != nil {
			return s, err
		}
		if err := buildP2Script(b.stmts, p2Params{partitions: c.Partitions, mandates: m, batch: batch, payload: payload}, s.script); err != nil {
			return s, err
		}
		b.logf("P2 set-up %s: %d mandates in %.1fs", name, m, time.Since(t).Seconds())
		return s, nil
	}
	small, err := mk("1k", c.SmallMandates)
	if err != nil {
		return err
	}
	large, err := mk("1m", c.LargeMandates)
	if err != nil {
		return err
	}
	defer func() {
		for _, db := range []string{small.template, small.p2tpl, large.template, large.p2tpl, "bench_p2x"} {
			_ = b.pg.drop(context.WithoutCancel(ctx), db)
		}
	}()
	type arm struct {
		s      setup
		before func() error
	}
	noTriggers := func() error {
		return b.pg.exec(ctx, "bench_p2x", `ALTER TABLE authorizations DISABLE TRIGGER USER; ALTER TABLE mandates DISABLE TRIGGER USER`)
	}
	walCompression := func(v string) func() error {
		return func() error {
			return b.pg.exec(ctx, "postgres", fmt.Sprintf(`ALTER SYSTEM SET wal_compression = '%s'`, v))
		}
	}
	reload := func() error { return b.pg.exec(ctx, "postgres", `SELECT pg_reload_conf()`) }
	exps := []struct {
		e    Experiment
		a, b arm
	}{
		{Experiment{Name: "guard triggers off (ALTER TABLE … DISABLE TRIGGER USER) ÷ on, 1 k mandates",
			Note: "the partition guard (PL/pgSQL, per row on authorizations and mandates) and the terminal guard; foreign keys stay"},
			arm{small, nil}, arm{small, noTriggers}},
		{Experiment{Name: "1 M ÷ 1 k mandates, PostgreSQL alone",
			Note: "same script shape; with 1 M mandates nearly every record of a batch updates its own mandate row"},
			arm{small, nil}, arm{large, nil}},
		{Experiment{Name: "wal_compression lz4 ÷ off, 1 M mandates",
			Note: "full-page images dominate the WAL of the 1 M case"},
			arm{large, walCompression("off")}, arm{large, walCompression("lz4")}},
	}
	var out []Experiment
	for _, x := range exps {
		e := x.e
		for i := range c.Rounds {
			arms := [2]arm{x.a, x.b}
			order := []int{0, 1}
			if i%2 == 1 {
				order = []int{1, 0}
			}
			var tps [2]float64
			for _, k := range order {
				a := arms[k]
				if err := b.pg.clone(ctx, a.s.p2tpl, "bench_p2x"); err != nil {
					return err
				}
				if a.before != nil {
					if err := a.before(); err != nil {
						return err
					}
					if err := reload(); err != nil {
						return err
					}
				}
				r, err := b.runPgbench(ctx, "P2-"+a.s.name, "bench_p2x", a.s.script, int(c.Partitions), c.PgbenchSecs)
				if err != nil {
					return err
				}
				tps[k] = r.TPS
			}
			e.ATPS, e.BTPS = append(e.ATPS, tps[0]), append(e.BTPS, tps[1])
			e.Ratios = append(e.Ratios, tps[1]/tps[0])
			b.logf("%s: pair %d: A %.1f tps, B %.1f tps, B÷A %.2f", e.Name, i+1, tps[0], tps[1], tps[1]/tps[0])
		}
		e.Median = median(e.Ratios)
		out = append(out, e)
	}
	_ = walCompression("off")()
	_ = reload()
	dir := filepath.Join(c.ResultsDir, time.Now().UTC().Format("2006-01-02")+"-experiments")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(struct {
		Started     time.Time    `json:"started"`
		LoadAvg     string       `json:"loadavg"`
		Batch       int          `json:"batch"`
		Clients     int32        `json:"clients"`
		Seconds     int          `json:"seconds"`
		Experiments []Experiment `json:"experiments"`
	}{b.started.UTC(), newResult(c).Host.LoadAvg, batch, c.Partitions, c.PgbenchSecs, out}, "", "  ")
	var md strings.Builder
	fmt.Fprintf(&md, "# PostgreSQL-alone experiments — %s\n\npgbench replays one %d-proposal batch of sink's SQL per transaction (P2), %d clients, %d s per run, pairs interleaved. `benchrun run --stop-after experiments`.\n\n| experiment | B ÷ A (median) | per pair | A TPS | B TPS | note |\n|---|---|---|---|---|---|\n",
		b.started.UTC().Format("2006-01-02 15:04 UTC"), batch, c.Partitions, c.PgbenchSecs)
	for _, e := range out {
		fmt.Fprintf(&md, "| %s | %.2f | %s | %s | %s | %s |\n", e.Name, e.Median, floats(e.Ratios, "%.2f"), floats(e.ATPS, "%.1f"), floats(e.BTPS, "%.1f"), e.Note)
	}
	if err := os.WriteFile(filepath.Join(dir, "experiments.json"), js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "experiments.md"), []byte(md.String()), 0o644)
}

func floats(xs []float64, f string) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf(f, x))
	}
	return strings.Join(s, ", ")
}
