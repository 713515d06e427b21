package gateway

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// OpenAPI is the gateway's OpenAPI 3.1 document, served at /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Server is the HTTP gateway.
type Server struct {
	cfg     Config
	log     zerolog.Logger
	client  *client.Client
	db      *pgxpool.Pool
	shards  []*pgxpool.Pool // with a shard map: every shard's, for status reads
	metrics *metrics
	mux     *http.ServeMux

	mu       sync.Mutex
	inFlight map[string]int // per org
}

// WithShards makes status reads look in every database of a shard map
// (a mandate's rows are in its partition's shard); db stays the control
// shard's, where the tokens are. Call before serving.
func (s *Server) WithShards(pools ...*pgxpool.Pool) *Server {
	s.shards = pools
	return s
}

// New makes a gateway over a client (producing, waiting) and a pool whose
// role may only read (status, tokens). reg receives its metrics.
func New(cfg Config, cl *client.Client, db *pgxpool.Pool, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger.With().Str("component", "gateway").Logger(), client: cl, db: db,
		metrics: newMetrics(reg), mux: http.NewServeMux(), inFlight: map[string]int{}}
	const base = "/v1/orgs/{org}/mandates/{mandate}"
	s.route("POST "+base+"/proposals", "propose", s.command(wire.CmdPropose))
	s.route("GET "+base+"/proposals/{key}", "proposal_status", s.proposalStatus)
	s.route("GET "+base+"/authorizations/{authorization}", "authorization_status", s.authorizationStatus)
	s.route("POST "+base+"/authorizations/{authorization}/begin", "begin", s.command(wire.CmdBegin))
	s.route("POST "+base+"/authorizations/{authorization}/commit", "commit", s.command(wire.CmdCommit))
	s.route("POST "+base+"/authorizations/{authorization}/cancel", "cancel", s.command(wire.CmdCancel))
	s.route("POST "+base+"/authorizations/{authorization}/report-unknown", "report_unknown", s.command(wire.CmdReportUnknown))
	// The control plane has no HTTP door: say so instead of a bare 404.
	s.route("POST "+base+"/authorizations/{authorization}/resolve", "resolve", s.controlPlane)
	s.route("POST "+base+"/grants", "grant", s.controlPlane)
	s.route("POST "+base+"/revoke", "revoke", s.controlPlane)
	s.mux.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(OpenAPI)
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusNotFound, ReasonNotFound, "no such resource", nil)
	})
	return s, nil
}

// Handler serves the API (the operational endpoints are the caller's: see
// cmd/mandate-gateway).
func (s *Server) Handler() http.Handler { return s.mux }

// HTTPServer returns an http.Server for the handler with the configured
// timeouts and header limit.
func (s *Server) HTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr: addr, Handler: h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.MaxWait + s.cfg.ReadTimeout, IdleTimeout: s.cfg.IdleTimeout,
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
	}
}

// Ready reports whether PostgreSQL and Kafka answer.
func (s *Server) Ready(ctx context.Context) error {
	if err := s.db.Ping(ctx); err != nil {
		return fmt.Errorf("postgresql: %w", err)
	}
	if err := s.client.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (s *Server) route(pattern, name string, h http.HandlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		h(rec, r)
		s.metrics.requests.WithLabelValues(name, strconv.Itoa(rec.code)).Inc()
		s.metrics.duration.WithLabelValues(name).Observe(time.Since(start).Seconds())
		if rec.code >= 500 {
			s.log.Warn().Str("route", name).Int("status", rec.code).Str("path", r.URL.Path).Msg("request failed")
		}
	})
}

// authenticate checks the bearer token against the org of the URL. It
// writes the problem and returns false when the caller may not go on.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (Token, bool) {
	org := r.PathValue("org")
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		s.metrics.authFailures.WithLabelValues("missing").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="mandated"`)
		writeProblem(w, r, http.StatusUnauthorized, ReasonUnauthenticated, "a bearer token is required (mandatectl tokens create)", nil)
		return Token{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	t, err := lookupToken(ctx, s.db, strings.TrimSpace(token))
	switch {
	case errors.Is(err, ErrTokenInvalid):
		s.metrics.authFailures.WithLabelValues("invalid").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="mandated", error="invalid_token"`)
		writeProblem(w, r, http.StatusUnauthorized, ReasonUnauthenticated, "the bearer token is unknown or revoked", nil)
		return Token{}, false
	case err != nil:
		writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, "cannot check the token now", nil)
		return Token{}, false
	case t.Org != org:
		s.metrics.authFailures.WithLabelValues("other_org").Inc()
		writeProblem(w, r, http.StatusForbidden, ReasonOrgForbidden, "the token does not act for this org", nil)
		return Token{}, false
	}
	return t, true
}

func (s *Server) controlPlane(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	writeProblem(w, r, http.StatusForbidden, ReasonControlPlane,
		"grants, revokes and resolves are the control plane's: they are produced to the grants topic by grantors and reconcilers, never through the gateway", nil)
}

// fieldsFromURL are set by the gateway; a body must not name them.
var fieldsFromURL = []string{"v", "type", "org", "mandate_id", "authorization_id", "idempotency_key", "executor", "sent_at"}

// command handles one command on its resource.
func (s *Server) command(typ wire.CommandType) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.authenticate(w, r); !ok {
			return
		}
		org, mandate, authID := r.PathValue("org"), r.PathValue("mandate"), r.PathValue("authorization")
		if _, err := partitioner.NewMandateKey(org, mandate); err != nil {
			writeProblem(w, r, http.StatusBadRequest, wire.ReasonIDInvalid, err.Error(), nil)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		if typ == wire.CmdPropose && key == "" {
			writeProblem(w, r, http.StatusBadRequest, ReasonMissingIdempotencyKey,
				"a proposal needs an Idempotency-Key header naming its business intent (the same on every retry)", nil)
			return
		}
		body, ok := s.readBody(w, r)
		if !ok {
			return
		}
		for _, f := range fieldsFromURL {
			if _, present := body[f]; present {
				writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid,
					fmt.Sprintf("%q comes from the URL or the headers, not the body", f), nil)
				return
			}
		}
		body["type"], body["org"], body["mandate_id"] = string(typ), org, mandate
		if authID != "" {
			body["authorization_id"] = authID
		}
		switch {
		case key == "":
		case typ == wire.CmdBegin:
			// On begin the key names this execution attempt: the executor.
			body["executor"] = key
		default:
			body["idempotency_key"] = key
		}
		raw, err := json.Marshal(body)
		if err != nil {
			writeProblem(w, r, http.StatusBadRequest, wire.ReasonMalformedJSON, err.Error(), nil)
			return
		}
		wait, ok := s.wait(w, r)
		if !ok {
			return
		}
		if !s.enter(org) {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, r, http.StatusTooManyRequests, ReasonTooManyInFlight,
				fmt.Sprintf("more than %d commands of this org are waiting for decisions", s.cfg.MaxInFlightPerOrg), nil)
			return
		}
		defer s.leave(org)

		status := statusURL(org, mandate, typ, authID, key, body)
		src, err := s.client.Submit(r.Context(), client.RawCommand(raw))
		var inv *client.InvalidCommandError
		switch {
		case errors.As(err, &inv):
			writeProblem(w, r, statusOfRejection(inv.Reason), inv.Reason, inv.Detail, nil)
			return
		case err != nil:
			s.log.Warn().Err(err).Msg("produce failed")
			writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, "the command could not be produced; retry with the same Idempotency-Key", nil)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		d, err := s.client.Await(ctx, src)
		w.Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(wait/time.Second)))
		if errors.Is(err, client.ErrNoDecision) {
			s.metrics.waits.WithLabelValues("accepted").Inc()
			s.accepted(w, status, src)
			return
		}
		if err != nil {
			writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, err.Error(), nil)
			return
		}
		s.metrics.waits.WithLabelValues("decided").Inc()
		if d.AuthorizationID != "" {
			w.Header().Set("Content-Location", authorizationURL(org, mandate, d.AuthorizationID))
		}
		if code := statusOf(&d.Decision); code != http.StatusOK {
			writeProblem(w, r, code, d.Reason, cmpOr(d.Detail, string(d.Outcome)), d.Raw)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(bytes.TrimSpace(d.Raw), '\n'))
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// readBody reads a bounded JSON object body.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, wire.ReasonTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes), nil)
		return nil, false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeProblem(w, r, http.StatusUnsupportedMediaType, ReasonUnsupportedMediaType, "the body must be application/json", nil)
		return nil, false
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, wire.ReasonTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes), nil)
		return nil, false
	}
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, wire.ReasonMalformedJSON, "the body could not be read", nil)
		return nil, false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return map[string]any{}, true
	}
	// Keep numbers as written: the processor's strict decoder judges them.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var body map[string]any
	if err := dec.Decode(&body); err != nil || body == nil || dec.More() {
		writeProblem(w, r, http.StatusBadRequest, wire.ReasonMalformedJSON, "the body must be one JSON object", nil)
		return nil, false
	}
	return body, true
}

// wait reads Prefer: wait=N (RFC 7240), bounded by MaxWait.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n < 0 {
				writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid, "Prefer: wait must be a number of seconds", nil)
				return 0, false
			}
			return min(time.Duration(n)*time.Second, s.cfg.MaxWait), true
		}
	}
	return s.cfg.DefaultWait, true
}

func (s *Server) enter(org string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[org] >= s.cfg.MaxInFlightPerOrg {
		return false
	}
	s.inFlight[org]++
	s.metrics.inFlight.Inc()
	return true
}

func (s *Server) leave(org string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[org]--; s.inFlight[org] <= 0 {
		delete(s.inFlight, org)
	}
	s.metrics.inFlight.Dec()
}

// Accepted is the body of a 202: where to look, and where the command is.
type Accepted struct {
	Status    string      `json:"status"`
	StatusURL string      `json:"status_url"`
	Source    wire.Source `json:"source"`
}

func (s *Server) accepted(w http.ResponseWriter, status string, src wire.Source) {
	b, _ := json.Marshal(Accepted{Status: "accepted", StatusURL: status, Source: src})
	w.Header().Set("Location", status)
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(append(b, '\n'))
}

func authorizationURL(org, mandate, id string) string {
	return "/v1/orgs/" + url.PathEscape(org) + "/mandates/" + url.PathEscape(mandate) + "/authorizations/" + url.PathEscape(id)
}

// statusURL is where a command's outcome can be read: the proposal's
// idempotency record, or the authorization's row.
func statusURL(org, mandate string, typ wire.CommandType, authID, key string, body map[string]any) string {
	if typ != wire.CmdPropose {
		return authorizationURL(org, mandate, authID)
	}
	u := "/v1/orgs/" + url.PathEscape(org) + "/mandates/" + url.PathEscape(mandate) + "/proposals/" + url.PathEscape(key)
	if op, ok := body["operation"].(string); ok && op != "" {
		u += "?operation=" + url.QueryEscape(op)
	}
	return u
}

func (s *Server) writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

func (s *Server) authorizationStatus(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	a, err := s.authorization(r.Context(), r.PathValue("org"), r.PathValue("mandate"), r.PathValue("authorization"))
	switch {
	case errors.Is(err, errNoRow):
		writeProblem(w, r, http.StatusNotFound, wire.ReasonAuthorizationNotFound, "no such authorization", nil)
	case err != nil:
		s.log.Warn().Err(err).Msg("authorization status")
		writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, "cannot read the authorization now", nil)
	default:
		s.writeJSON(w, a)
	}
}

func (s *Server) proposalStatus(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	p, err := s.proposal(r.Context(), r.PathValue("org"), r.PathValue("mandate"), r.URL.Query().Get("operation"), r.PathValue("key"))
	switch {
	case errors.Is(err, errNoRow):
		writeProblem(w, r, http.StatusNotFound, ReasonNoDecisionRecorded,
			"no decision is bound to this key: it is not decided yet (poll again), or its answer binds no key "+
				"(rejected, stale_version, conflict, mandate_not_found, ...): send the same request again to read it", nil)
	case err != nil:
		s.log.Warn().Err(err).Msg("proposal status")
		writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, "cannot read the proposal now", nil)
	default:
		s.writeJSON(w, p)
	}
}
