package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/wire"
)

// viaGateway shows one proposal through the HTTP gateway with curl: a token
// for the org, a mandate granted over Kafka (the control plane), then one
// HTTP call that returns the decision.
func (d *demo) viaGateway(ctx context.Context, dbURL string, log zerolog.Logger) error {
	fmt.Println()
	fmt.Println("gateway  one proposal through the HTTP gateway (cmd/mandate-gateway), with curl:")
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, token, err := gateway.CreateToken(ctx, conn, "acme", "demo")
	if err != nil {
		return err
	}
	cl, err := client.New(ctx, client.Config{Brokers: d.brokers, ProposalsTopic: d.spec.Proposals,
		GrantsTopic: d.spec.Grants, DecisionsTopic: d.spec.Decisions, Logger: &log})
	if err != nil {
		return err
	}
	defer cl.Close()
	g, err := cl.Grant(ctx, client.Grant{Ref: client.Ref{Org: "acme", MandateID: "refund-http-7"}, Uses: 1,
		MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"}})
	if err != nil {
		return err
	}
	d.expect(g.Outcome == wire.OutcomeGranted, "the gateway demo's grant is granted, got %s", g.Outcome)

	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	srv, err := gateway.New(gateway.Config{Logger: &log}, cl, pool, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()

	url := "http://" + ln.Addr().String() + "/v1/orgs/acme/mandates/refund-http-7/proposals"
	key := client.IntentKey("run-7", "3", "payment.refund")
	body := `{"operation":"payment.refund","amount":{"minor_units":15000,"currency":"EUR"},"target":"customer-77"}`
	headers := []string{"Authorization: Bearer " + token, "Idempotency-Key: " + key, "Prefer: wait=10", "Content-Type: application/json"}
	shown := []string{"curl -sS -i -X POST " + url}
	for _, h := range headers {
		if strings.HasPrefix(h, "Authorization") {
			h = "Authorization: Bearer $TOKEN"
		}
		shown = append(shown, fmt.Sprintf("-H '%s'", h))
	}
	shown = append(shown, "-d '"+body+"'")
	fmt.Println("  $ " + strings.Join(shown, " \\\n      "))

	var status int
	var out []byte
	if curl, err := exec.LookPath("curl"); err == nil {
		args := []string{"-sS", "-i", "-X", "POST", url, "-d", body}
		for _, h := range headers {
			args = append(args, "-H", h)
		}
		raw, err := exec.CommandContext(ctx, curl, args...).Output()
		if err != nil {
			return fmt.Errorf("curl: %w", err)
		}
		head, rest, _ := bytes.Cut(raw, []byte("\r\n\r\n"))
		fmt.Sscanf(string(head), "HTTP/%s %d", new(string), &status)
		out = rest
	} else {
		fmt.Println("  (curl is not installed: the same request with Go's net/http)")
		req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ": ")
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		status = resp.StatusCode
		out, _ = io.ReadAll(resp.Body)
	}
	var dec wire.Decision
	_ = json.Unmarshal(out, &dec)
	fmt.Printf("  HTTP %d: outcome %s, authorization %s, mandate uses held %d of %d\n", status, dec.Outcome, dec.AuthorizationID,
		usesHeld(&dec), usesAllowed(&dec))
	d.expect(status == http.StatusOK && dec.Outcome == wire.OutcomeReserved, "the gateway answers 200 reserved, got %d %s", status, dec.Outcome)
	return nil
}

func usesHeld(d *wire.Decision) int64 {
	if d.Mandate == nil {
		return 0
	}
	return d.Mandate.UsesHeld
}

func usesAllowed(d *wire.Decision) int64 {
	if d.Mandate == nil {
		return 0
	}
	return d.Mandate.UsesAllowed
}
