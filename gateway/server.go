package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/internal/tracing"
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
	db      *pgxpool.Pool // the control database's (tokens); every read without a shard map
	shards  *Shards       // with a shard map: where each partition's rows are
	metrics *metrics
	mux     *http.ServeMux

	partitions atomic.Int32 // mandated's partition count, once read
	routes     []string     // the patterns served, "METHOD /path/{param}"

	mu       sync.Mutex
	inFlight map[string]int // per org
}

// WithShards routes every status read to the database of the mandate's
// partition as the shard map says (and says again after Shards.Reload);
// db stays the control shard's, where the tokens are. Call before serving.
func (s *Server) WithShards(sh *Shards) *Server {
	s.shards = sh
	sh.reloads = func(result string) { s.metrics.shardMapReloads.WithLabelValues(result).Inc() }
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
	s.route("POST "+base+"/records", "record", s.command(wire.CmdRecord))
	s.route("GET "+base+"/proposals/{key}", "proposal_status", s.proposalStatus)
	s.route("GET "+base+"/requests/{request}", "request_status", s.requestStatus)
	s.route("GET "+base+"/authorizations/{authorization}", "authorization_status", s.authorizationStatus)
	s.route("POST "+base+"/authorizations/{authorization}/begin", "begin", s.command(wire.CmdBegin))
	s.route("POST "+base+"/authorizations/{authorization}/commit", "commit", s.command(wire.CmdCommit))
	s.route("POST "+base+"/authorizations/{authorization}/cancel", "cancel", s.command(wire.CmdCancel))
	s.route("POST "+base+"/authorizations/{authorization}/report-unknown", "report_unknown", s.command(wire.CmdReportUnknown))
	// The control plane has no HTTP door: say so instead of a bare 404.
	s.route("POST "+base+"/authorizations/{authorization}/resolve", "resolve", s.controlPlane)
	s.route("POST "+base+"/grants", "grant", s.controlPlane)
	s.route("POST "+base+"/revoke", "revoke", s.controlPlane)
	s.route("GET /v1/openapi.yaml", "openapi", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(OpenAPI)
	})
	s.mux.HandleFunc("/", s.notFound)
	return s, nil
}

// Routes are the patterns the API serves ("POST /v1/orgs/{org}/..."): the
// OpenAPI document has an operation for each (a test checks both ways).
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// methods are the methods a route may be registered for.
var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// notFound answers what no route took: 405 with Allow when the path is a
// route of other methods, 404 otherwise. (The catch-all "/" takes every
// method, so ServeMux's own 405 never happens.)
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range methods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeProblem(w, r, http.StatusNotFound, ReasonNotFound, "no such resource", nil)
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeProblem(w, r, http.StatusMethodNotAllowed, ReasonMethodNotAllowed,
		fmt.Sprintf("%s is not a method of this resource (Allow: %s)", r.Method, strings.Join(allow, ", ")), nil)
}

// Handler serves the API (the operational endpoints are the caller's: see
// cmd/mandate-gateway), traced by otelhttp when Config.TracerProvider is
// set.
func (s *Server) Handler() http.Handler {
	if s.cfg.TracerProvider == nil {
		return s.mux
	}
	return untraceDuplicates(otelhttp.NewHandler(s.mux, "mandate-gateway", otelhttp.WithTracerProvider(s.cfg.TracerProvider),
		otelhttp.WithPropagators(tracing.Propagator)))
}

// singleValued are the request headers the gateway reads that take one
// value. Each sent twice is refused (400 ambiguous_header) before anything
// else, as the contract's decoder refuses a duplicate JSON member: a proxy
// in front may have read the other value (the first Executor would win an
// execution, the first Idempotency-Key bind the intent, the first
// Authorization act for one org while the proxy logged the other).
// Not in the list, on purpose: Prefer is a list (RFC 7240 section 2: a
// preference given twice counts once, the first), and only says how long
// to wait; traceparent (and tracestate) decide nothing, and W3C Trace
// Context treats a duplicated traceparent as no trace context at all
// (untraceDuplicates). Content-Length, Host and Transfer-Encoding are
// net/http's, which refuses conflicting copies itself.
var singleValued = []string{"Authorization", "Idempotency-Key", "Executor", "Content-Type"}

// duplicated returns the first single-valued header sent more than once.
func duplicated(h http.Header) (string, bool) {
	for _, name := range singleValued {
		if len(h.Values(name)) > 1 {
			return name, true
		}
	}
	return "", false
}

// untraceDuplicates drops a trace context whose traceparent is sent more
// than once, so the request starts a new trace instead of joining the
// first (W3C Trace Context test suite: test_traceparent_duplicated).
func untraceDuplicates(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values(wire.HeaderTraceParent)) > 1 {
			r = r.Clone(r.Context())
			r.Header.Del(wire.HeaderTraceParent)
			r.Header.Del("tracestate")
		}
		next.ServeHTTP(w, r)
	})
}

// Mux is the API's router, for a caller that adds routes of its own beside
// the API's (the console, under /console).
func (s *Server) Mux() *http.ServeMux { return s.mux }

// HTTPServer returns an http.Server for the handler with the configured
// timeouts and header limit. Serve it with Server.Serve.
func (s *Server) HTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr: addr, Handler: h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, ReadTimeout: s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.MaxWait + s.cfg.ReadTimeout, IdleTimeout: s.cfg.IdleTimeout,
		MaxHeaderBytes: s.cfg.MaxHeaderBytes,
	}
}

// Ready reports whether PostgreSQL (every shard's, with a map) and Kafka
// answer.
func (s *Server) Ready(ctx context.Context) error {
	if err := s.db.Ping(ctx); err != nil {
		return fmt.Errorf("postgresql: %w", err)
	}
	if s.shards != nil {
		if err := s.shards.ping(ctx); err != nil {
			return err
		}
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
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		span := trace.SpanFromContext(r.Context())
		span.SetName(pattern)
		if name, ok := duplicated(r.Header); ok {
			writeProblem(rec, r, http.StatusBadRequest, ReasonAmbiguousHeader,
				"the "+name+" header is sent more than once: it takes one value (send it once)", nil)
		} else {
			h(rec, r)
		}
		s.metrics.requests.WithLabelValues(name, strconv.Itoa(rec.code)).Inc()
		tracing.Observe(s.metrics.duration.WithLabelValues(name), time.Since(start).Seconds(), span.SpanContext())
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
		detail := "the bearer token is unknown or revoked"
		if strings.HasPrefix(strings.TrimSpace(token), operatorTokenPrefix) {
			// As the console says of an API token, the other way round.
			detail = "that is an operator token: it signs in to the console only; the API takes an org's API token (mandatectl tokens create ORG)"
		}
		writeProblem(w, r, http.StatusUnauthorized, ReasonUnauthenticated, detail, nil)
		return Token{}, false
	case err != nil:
		w.Header().Set("Retry-After", "1")
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

// command handles one command on its resource: the body's exact bytes are
// checked with the contract's scanner, the record is built around them and
// decoded with the contract's decoder, and exactly that record is produced
// (with the request's id in a header), so the gateway produces only what
// the processor accepts and refuses what it would refuse, for the same
// reason. The produce and the wait for the decision share the caller's
// wait (at least ProduceTimeout for the produce).
func (s *Server) command(typ wire.CommandType) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.authenticate(w, r); !ok {
			return
		}
		org, mandate, authID := r.PathValue("org"), r.PathValue("mandate"), r.PathValue("authorization")
		mk, err := partitioner.NewMandateKey(org, mandate)
		if err != nil {
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
		members := map[string]any{}
		if len(body) > 0 {
			m, rej := wire.ParseObject(body)
			if rej != nil {
				writeProblem(w, r, statusOfRejection(rej.Reason), rej.Reason, rej.Detail, nil)
				return
			}
			members = m
		}
		for _, f := range fromURL {
			if _, present := members[f]; present {
				writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid,
					fmt.Sprintf("%q comes from the URL or the headers, not the body", f), nil)
				return
			}
		}
		head := []member{{name: "v", value: []byte(strconv.Itoa(wire.SchemaVersion))}, stringMember("type", string(typ)),
			stringMember("org", org), stringMember("mandate_id", mandate)}
		if authID != "" {
			head = append(head, stringMember("authorization_id", authID))
		}
		if key != "" {
			head = append(head, stringMember("idempotency_key", key))
		}
		executor, ok := s.executor(w, r, typ, members)
		if !ok {
			return
		}
		if executor != "" {
			head = append(head, stringMember("executor", executor))
		}
		head = append(head, stringMember("sent_at", time.Now().UTC().Format(time.RFC3339Nano)))
		record := buildRecord(head, body)
		if _, rej := wire.Decode(mk.Bytes(), record, wire.Limits{MaxRecordBytes: s.cfg.MaxRecordBytes}); rej != nil {
			writeProblem(w, r, statusOfRejection(rej.Reason), rej.Reason, rej.Detail, nil)
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

		start := time.Now()
		nonce, err := newNonce()
		if err != nil {
			writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, err.Error(), nil)
			return
		}
		pctx, cancel := context.WithTimeout(r.Context(), max(wait, s.cfg.ProduceTimeout))
		src, err := s.client.SubmitExact(pctx, mk, record, kgo.RecordHeader{Key: wire.HeaderRequest, Value: []byte(nonce)})
		cancel()
		var inv *client.InvalidCommandError
		switch {
		case errors.As(err, &inv):
			writeProblem(w, r, statusOfRejection(inv.Reason), inv.Reason, inv.Detail, nil)
			return
		case err != nil:
			s.metrics.waits.WithLabelValues("unavailable").Inc()
			s.log.Warn().Err(err).Str("org", org).Str("mandate_id", mandate).Msg("produce failed or was not acknowledged within the wait")
			w.Header().Set("Retry-After", "1")
			detail := "Kafka did not acknowledge the command within the wait; it may still be decided: retry with the same Idempotency-Key"
			if typ == wire.CmdBegin {
				detail += " and the same Executor"
			}
			writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, detail, nil)
			return
		}
		id := requestID{partition: src.Partition, offset: src.Offset, nonce: nonce}
		w.Header().Set("Request-Id", id.String())
		ctx, cancel := context.WithTimeout(r.Context(), max(0, wait-time.Since(start)))
		defer cancel()
		d, err := s.client.Await(ctx, src)
		w.Header().Set("Preference-Applied", "wait="+strconv.FormatInt(int64(wait/time.Second), 10))
		if errors.Is(err, client.ErrNoDecision) {
			s.metrics.waits.WithLabelValues("accepted").Inc()
			s.accepted(w, requestURL(org, mandate, id), id, src)
			return
		}
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, err.Error(), nil)
			return
		}
		s.metrics.waits.WithLabelValues("decided").Inc()
		setSignature(w, d.Signature)
		s.writeDecision(w, r, &d.Decision, d.Raw)
	}
}

// writeDecision answers with a decision: 200 with it, or a problem that
// carries it (statusOf).
func (s *Server) writeDecision(w http.ResponseWriter, r *http.Request, d *wire.Decision, raw []byte) {
	if d.AuthorizationID != "" {
		w.Header().Set("Content-Location", authorizationURL(d.Org, d.MandateID, d.AuthorizationID))
	}
	if code := statusOf(d); code != http.StatusOK {
		writeProblem(w, r, code, d.Reason, cmpOr(d.Detail, string(d.Outcome)), raw)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(bytes.TrimSpace(raw), '\n'))
}

// executor returns the executor a begin's record names in its head: the
// Executor header, or one the gateway mints when neither the header nor the
// body names one. An executor is one attempt, never the intent's
// Idempotency-Key: workers that derive keys from workflow facts send the
// same key, and must not all be told to execute. The effective executor is
// answered in the Executor response header. Other commands take no
// executor.
func (s *Server) executor(w http.ResponseWriter, r *http.Request, typ wire.CommandType, members map[string]any) (string, bool) {
	header := r.Header.Get("Executor")
	if typ != wire.CmdBegin {
		if header != "" {
			writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid, "the Executor header names a begin's attempt; "+string(typ)+" takes none", nil)
			return "", false
		}
		return "", true
	}
	inBody, present := members["executor"]
	switch {
	case present && header != "":
		if s, isStr := inBody.(string); !isStr || s != header {
			writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid, "the body's executor and the Executor header differ", nil)
			return "", false
		}
		w.Header().Set("Executor", header)
		return "", true // the body names it
	case present:
		if s, isStr := inBody.(string); isStr && partitioner.ValidID(s) {
			w.Header().Set("Executor", s)
		}
		return "", true
	case header != "":
		w.Header().Set("Executor", header)
		return header, true
	}
	minted, err := newNonce()
	if err != nil {
		writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, err.Error(), nil)
		return "", false
	}
	w.Header().Set("Executor", "gw-"+minted)
	return "gw-" + minted, true
}

// newNonce returns 16 random bytes in lower-case base32 (26 characters).
func newNonce() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("gateway: random: %w", err)
	}
	return tokenEncoding.EncodeToString(b), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// readBody reads a bounded body, exactly as sent. A body of JSON
// whitespace only is no body (nil); any other body must be
// application/json.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, wire.ReasonTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes), nil)
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
	if len(bytes.TrimLeft(b, " \t\r\n")) == 0 {
		return nil, true
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeProblem(w, r, http.StatusUnsupportedMediaType, ReasonUnsupportedMediaType, "a body must be application/json", nil)
		return nil, false
	}
	return b, true
}

// wait reads Prefer: wait=N (RFC 7240), bounded by MaxWait: N is read as
// a count of seconds of any length, and anything past MaxWait is MaxWait.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	for _, v := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			digits := strings.Trim(strings.TrimSpace(val), `"`)
			if digits == "" || strings.Trim(digits, "0123456789") != "" {
				writeProblem(w, r, http.StatusBadRequest, wire.ReasonFieldInvalid, "Prefer: wait must be a number of seconds", nil)
				return 0, false
			}
			maxSecs := int64(s.cfg.MaxWait / time.Second)
			if n, err := strconv.ParseInt(digits, 10, 64); err == nil && n <= maxSecs {
				return min(time.Duration(n)*time.Second, s.cfg.MaxWait), true
			}
			return s.cfg.MaxWait, true // more seconds than MaxWait (or than an int64 holds)
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

// Accepted is the body of a 202: the request's id and status URL, and where
// its command is.
type Accepted struct {
	Status    string      `json:"status"`
	RequestID string      `json:"request_id"`
	StatusURL string      `json:"status_url"`
	Source    wire.Source `json:"source"`
}

func (s *Server) accepted(w http.ResponseWriter, status string, id requestID, src wire.Source) {
	b, _ := json.Marshal(Accepted{Status: "accepted", RequestID: id.String(), StatusURL: status, Source: src})
	w.Header().Set("Location", status)
	w.Header().Set("Retry-After", "1")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(append(b, '\n'))
}

func mandateURL(org, mandate string) string {
	return "/v1/orgs/" + url.PathEscape(org) + "/mandates/" + url.PathEscape(mandate)
}

func authorizationURL(org, mandate, id string) string {
	return mandateURL(org, mandate) + "/authorizations/" + url.PathEscape(id)
}

// requestURL is a request's status URL: its decision, once made, and only
// its own.
func requestURL(org, mandate string, id requestID) string {
	return mandateURL(org, mandate) + "/requests/" + id.String()
}

func (s *Server) writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

// unavailable answers a read PostgreSQL did not serve.
func (s *Server) unavailable(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Warn().Err(err).Str("path", r.URL.Path).Msg(what)
	w.Header().Set("Retry-After", "1")
	writeProblem(w, r, http.StatusServiceUnavailable, ReasonUnavailable, "cannot "+what+" now", nil)
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
		s.unavailable(w, r, "read the authorization", err)
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
			"no decision is bound to this key: it is not decided yet, or its answer binds no key "+
				"(rejected, stale_version, conflict, mandate_not_found, ...): each request's own answer is at its status URL (.../requests/{id})", nil)
	case err != nil:
		s.unavailable(w, r, "read the proposal", err)
	default:
		s.writeJSON(w, p)
	}
}

func (s *Server) requestStatus(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticate(w, r); !ok {
		return
	}
	org, mandate := r.PathValue("org"), r.PathValue("mandate")
	id, ok := parseRequestID(r.PathValue("request"))
	if !ok {
		writeProblem(w, r, http.StatusNotFound, ReasonRequestNotFound, "not a request id (rq-<partition>-<offset>-<nonce>)", nil)
		return
	}
	st, err := s.request(r.Context(), org, mandate, id)
	switch {
	case errors.Is(err, errNoRow):
		writeProblem(w, r, http.StatusNotFound, ReasonRequestNotFound,
			"no such request on this mandate, or its record is past the org's retention", nil)
	case err != nil:
		s.unavailable(w, r, "read the request", err)
	default:
		if st.Status == RequestPending {
			w.Header().Set("Retry-After", "1")
		}
		s.writeJSON(w, st)
	}
}
