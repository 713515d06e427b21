// Package console is the operators' web console of mandate-gateway,
// served under /console: the in-doubt queue (age, executor), reconciling an
// in-doubt execution (resolve committed or cancelled with evidence, signed
// where the org requires it, produced to the grants topic as mandatectl
// reconcile does, with client.Record), a mandate's page (terms, uses held
// and spent, authorizations with their states, executors, results and fork
// lineage, its latest decisions), the partitions (owner, epoch, lag, outbox
// backlog) and the last verify result (verify_runs, written by mandatectl
// verify --record). It finds any decision (search.go): one search box, a
// mandate's history, an authorization's timeline, one decision, and an
// overview of the last hour (history.go, overview.go), read from the
// decision history PostgreSQL keeps (migration 0051, sink/history.go).
//
// Pages are rendered on the server (html/template, no script, no CDN: one
// stylesheet it serves itself). Operators sign in with an operator token
// (mandatectl tokens create --operator), a kind of token the API refuses,
// as the console refuses API tokens. Sign-in opens a server-side session
// (console_sessions, session.go) with an expiry (Config.SessionTTL); the
// cookie (HttpOnly, SameSite=Strict, scoped to /console) holds the
// session's secret, never the token; sign-out ends the session on every
// gateway instance. A client that is not a browser may send the token as
// a bearer token instead. Each request checks the session and its token in
// PostgreSQL (a revocation applies at once); neither appears in a page.
// The state-changing forms (reconcile, sign-out) carry a CSRF token
// derived from the session and are refused from another origin. Pages
// carry no secret: no token, no key, no database URL.
//
// It reads PostgreSQL (sink's operator queries) and produces only resolves,
// through the client. It stands on gateway (tokens), client, sink, wire and
// partitioner (test/layout); it never imports processor, lifecycle's
// decisions aside from the rows sink returns, outbox, verify or admin.
package console

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/sink"
)

// Defaults of Config.
const (
	DecisionTimeoutDefault = 15 * time.Second
	QueryTimeoutDefault    = 10 * time.Second
	InDoubtLimitDefault    = 500
	AuthorizationsDefault  = 200
	SessionTTLDefault      = 8 * time.Hour
	HistoryPageDefault     = 50
	TimelineDefault        = 500
)

// CookieName is the console's session cookie: a session's secret (never
// the operator token), HttpOnly, SameSite=Strict, Path=/console, Max-Age
// the session's lifetime.
const CookieName = "mandated_console"

// Config configures a Console.
type Config struct {
	// Signers sign the resolves of the orgs that require signed grantor
	// commands (grant_signing required), by org: a key registered for the
	// org (mandatectl grantor-keys). An org that requires signing and has
	// no signer here cannot be reconciled from the console (the page says
	// so; use mandatectl reconcile --signing-key-file). Defaults to none.
	Signers map[string]*client.Signer
	// DecisionTimeout bounds the wait for a resolve's decision. Defaults to
	// DecisionTimeoutDefault.
	DecisionTimeout time.Duration
	// QueryTimeout bounds each page's reads. Defaults to QueryTimeoutDefault.
	QueryTimeout time.Duration
	// InDoubtLimit bounds the in-doubt queue shown. Defaults to
	// InDoubtLimitDefault.
	InDoubtLimit int
	// Authorizations bounds the authorizations a mandate's page shows
	// (newest first). Defaults to AuthorizationsDefault.
	Authorizations int
	// HistoryPage bounds the decisions a page of a mandate's history
	// shows (newest first, then older pages). Defaults to
	// HistoryPageDefault.
	HistoryPage int
	// Timeline bounds the decisions an authorization's timeline shows
	// (oldest first). Defaults to TimelineDefault.
	Timeline int
	// SessionTTL is how long a session lasts from sign-in (the cookie's
	// Max-Age too); sign-out ends it at once. Defaults to
	// SessionTTLDefault.
	SessionTTL time.Duration
	// SecureCookie marks the session cookie Secure (the gateway serves
	// TLS). Defaults to false.
	SecureCookie bool
	// Logger receives one event per sign-in, refused sign-in and resolve.
	// Defaults to zerolog.Nop().
	Logger *zerolog.Logger
	// Now is the clock of the pages' ages. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.DecisionTimeout = cmp.Or(c.DecisionTimeout, DecisionTimeoutDefault)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, QueryTimeoutDefault)
	c.InDoubtLimit = cmp.Or(c.InDoubtLimit, InDoubtLimitDefault)
	c.Authorizations = cmp.Or(c.Authorizations, AuthorizationsDefault)
	c.HistoryPage = cmp.Or(c.HistoryPage, HistoryPageDefault)
	c.Timeline = cmp.Or(c.Timeline, TimelineDefault)
	c.SessionTTL = cmp.Or(c.SessionTTL, SessionTTLDefault)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.DecisionTimeout < 0 || c.QueryTimeout < 0:
		return errors.New("console: DecisionTimeout and QueryTimeout must not be negative")
	case c.InDoubtLimit < 0 || c.Authorizations < 0 || c.HistoryPage < 0 || c.Timeline < 0:
		return errors.New("console: InDoubtLimit, Authorizations, HistoryPage and Timeline must not be negative")
	case c.SessionTTL < 0:
		return errors.New("console: SessionTTL must not be negative")
	}
	for org, s := range c.Signers {
		if s == nil || s.KeyID == "" || len(s.Key) == 0 {
			return fmt.Errorf("console: the signer of org %q needs a key id and a key", org)
		}
	}
	return nil
}

// Sources are what the console reads and writes through.
type Sources struct {
	// Client produces resolves to the grants topic and reads the topics'
	// end offsets (lag).
	Client *client.Client
	// Control is the control database (operator tokens, verify_runs,
	// grant_signing).
	Control *pgxpool.Pool
	// Operator returns the operator queries over every shard (called per
	// page: a reloaded shard map is followed).
	Operator func() *sink.Operator
}

// Console serves the pages.
type Console struct {
	cfg   Config
	log   zerolog.Logger
	src   Sources
	pages map[string]*template.Template
}

//go:embed templates/*.html static/*
var files embed.FS

// New makes a console.
func New(cfg Config, src Sources) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src.Client == nil || src.Control == nil || src.Operator == nil {
		return nil, errors.New("console: Client, Control and Operator are required")
	}
	cfg = cfg.WithDefaults()
	c := &Console{cfg: cfg, log: cfg.Logger.With().Str("component", "console").Logger(), src: src, pages: map[string]*template.Template{}}
	for _, page := range []string{"login", "indoubt", "reconcile", "resolved", "mandate", "partitions", "verify", "error",
		"history", "authorization", "decision", "search", "overview"} {
		t, err := template.New("layout.html").Funcs(funcs(cfg.Now)).ParseFS(files, "templates/layout.html", "templates/partials.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", page, err)
		}
		c.pages[page] = t
	}
	return c, nil
}

// Register adds the console's routes under /console/ to mux.
func (c *Console) Register(mux *http.ServeMux) {
	static, _ := fs.Sub(files, "static")
	mux.Handle("GET /console/static/", c.headers(http.StripPrefix("/console/static/", http.FileServerFS(static))))
	mux.Handle("GET /console", http.RedirectHandler("/console/", http.StatusSeeOther))
	mux.Handle("GET /console/login", c.headers(http.HandlerFunc(c.loginPage)))
	mux.Handle("POST /console/login", c.headers(http.HandlerFunc(c.login)))
	mux.Handle("POST /console/logout", c.headers(c.operator(c.logout)))
	mux.Handle("GET /console/{$}", c.headers(c.operator(c.inDoubtPage)))
	mux.Handle("GET /console/reconcile/{org}/{mandate}/{authorization}", c.headers(c.operator(c.reconcilePage)))
	mux.Handle("POST /console/reconcile/{org}/{mandate}/{authorization}", c.headers(c.operator(c.reconcile)))
	mux.Handle("GET /console/search", c.headers(c.operator(c.searchPage)))
	mux.Handle("GET /console/mandates", c.headers(c.operator(c.mandateLookup)))
	mux.Handle("GET /console/mandates/{org}/{mandate}", c.headers(c.operator(c.mandatePage)))
	mux.Handle("GET /console/mandates/{org}/{mandate}/history", c.headers(c.operator(c.mandateHistoryPage)))
	mux.Handle("GET /console/authorizations/{org}/{mandate}/{authorization}", c.headers(c.operator(c.authorizationPage)))
	mux.Handle("GET /console/decisions/{id}", c.headers(c.operator(c.decisionPage)))
	mux.Handle("GET /console/overview", c.headers(c.operator(c.overviewPage)))
	mux.Handle("GET /console/partitions", c.headers(c.operator(c.partitionsPage)))
	mux.Handle("GET /console/verify", c.headers(c.operator(c.verifyPage)))
	mux.Handle("/console/", c.headers(c.operator(func(w http.ResponseWriter, r *http.Request, _ session) {
		c.fail(w, r, nil, http.StatusNotFound, "No such page.")
	})))
}

// headers sets what every console response carries: no caching, no
// framing, no script, nothing loaded from elsewhere.
func (c *Console) headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// session is a signed-in operator: a console session (cookie) or a
// request carrying the operator token as a bearer token.
type session struct {
	token  gateway.Token
	csrf   string
	secret string // the console session's secret; "" for a bearer token
}

// operator runs h for a request of a live console session (the session
// cookie) or carrying a live operator token (Authorization: Bearer
// mop_..., for a client that is not a browser). Without one a page goes to
// the sign-in form and anything else is 401.
func (c *Console) operator(h func(http.ResponseWriter, *http.Request, session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
		defer cancel()
		var s session
		var err error
		bearer := ""
		if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			bearer = strings.TrimSpace(tok)
		}
		ck, _ := r.Cookie(CookieName)
		switch {
		case len(r.Header.Values("Authorization")) > 1 || countCookies(r, CookieName) > 1:
			// Two credentials of one kind: ambiguous, like the API's headers.
			err = gateway.ErrTokenInvalid
		case bearer != "":
			s.token, err = gateway.LookupOperatorToken(ctx, c.src.Control, bearer)
			s.csrf = csrfToken(bearer)
		case ck != nil:
			s.secret = ck.Value
			s.token, err = c.lookupSession(ctx, ck.Value)
			if errors.Is(err, errNoSession) {
				err = gateway.ErrTokenInvalid
			}
			s.csrf = csrfToken(ck.Value)
		default:
			err = gateway.ErrTokenInvalid
		}
		switch {
		case errors.Is(err, gateway.ErrTokenInvalid):
			if ck != nil {
				c.clearCookie(w)
			}
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/console/login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "Sign in with an operator token first.")
			return
		case err != nil:
			c.log.Warn().Err(err).Msg("cannot check an operator token or session")
			c.fail(w, r, nil, http.StatusServiceUnavailable, "PostgreSQL refused the read or did not answer (the gateway's log says which); try again.")
			return
		}
		h(w, r, s)
	})
}

// countCookies counts the cookies named name a request carries.
func countCookies(r *http.Request, name string) int {
	n := 0
	for _, ck := range r.Cookies() {
		if ck.Name == name {
			n++
		}
	}
	return n
}

// csrfToken is the form token of a session: an HMAC of a constant under
// the session's secret (or the bearer token). It names the session without
// revealing it and needs no more server-side state (any gateway instance
// checks it).
func csrfToken(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("mandated/console/csrf/v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// sameOrigin refuses a state-changing request another site made: a
// browser names the origin of a form it posts (Sec-Fetch-Site, which a
// page cannot forge, and Origin). A browser that sends Sec-Fetch-Site is
// believed on it alone: under some referrer policies a same-origin form
// is posted with "Origin: null". Without it, the Origin must name this
// host (or be absent: a client that is not a browser).
func sameOrigin(r *http.Request) bool {
	if len(r.Header.Values("Sec-Fetch-Site")) > 1 || len(r.Header.Values("Origin")) > 1 {
		return false // two answers to "where from": whichever a proxy read, refuse
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		return origin == "" // a form from an opaque origin (a sandbox, a file) is refused
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// checkForm refuses a POST without the session's CSRF token or from
// another origin.
func (c *Console) checkForm(w http.ResponseWriter, r *http.Request, s session) bool {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, &s, http.StatusBadRequest, "The form could not be read.")
		return false
	}
	if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
		c.log.Warn().Str("operator", s.token.ID).Str("path", r.URL.Path).Str("origin", r.Header.Get("Origin")).Msg("console: a form without this session's CSRF token or from another origin was refused")
		c.fail(w, r, &s, http.StatusForbidden, "This form did not come from this console (a missing or wrong CSRF token, or another origin). Reload the page and try again.")
		return false
	}
	return true
}

func (c *Console) setCookie(w http.ResponseWriter, secret string) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: secret, Path: "/console", HttpOnly: true, Secure: c.cfg.SecureCookie,
		SameSite: http.SameSiteStrictMode, MaxAge: c.sessionMaxAge()})
}

func (c *Console) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/console", HttpOnly: true, Secure: c.cfg.SecureCookie,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", nil, map[string]any{})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || !sameOrigin(r) {
		c.render(w, r, http.StatusForbidden, "login", nil, map[string]any{"Error": "The sign-in form did not come from this console."})
		return
	}
	secret := strings.TrimSpace(r.PostFormValue("token"))
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	t, err := gateway.LookupOperatorToken(ctx, c.src.Control, secret)
	switch {
	case errors.Is(err, gateway.ErrTokenInvalid):
		c.log.Warn().Str("remote", r.RemoteAddr).Msg("console: a sign-in with an unknown, revoked or non-operator token was refused")
		msg := "That is not a live operator token."
		if strings.HasPrefix(secret, "mgw_") {
			msg = "That is an API token of an org: the console takes operator tokens only (mandatectl tokens create --operator)."
		}
		c.render(w, r, http.StatusUnauthorized, "login", nil, map[string]any{"Error": msg})
		return
	case err != nil:
		c.log.Warn().Err(err).Msg("cannot check an operator token")
		c.render(w, r, http.StatusServiceUnavailable, "login", nil, map[string]any{"Error": "PostgreSQL refused the read or did not answer (the gateway's log says which); try again."})
		return
	}
	sess, err := c.openSession(ctx, t)
	if err != nil {
		c.log.Warn().Err(err).Msg("cannot open a console session")
		c.render(w, r, http.StatusServiceUnavailable, "login", nil, map[string]any{"Error": "PostgreSQL did not store the session (the gateway's log says why); try again."})
		return
	}
	c.log.Info().Str("operator", t.ID).Str("name", t.Name).Dur("ttl", c.cfg.SessionTTL).Msg("console: operator signed in")
	c.setCookie(w, sess)
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s session) {
	if !c.checkForm(w, r, s) {
		return
	}
	if s.secret != "" {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
		defer cancel()
		if err := c.endSession(ctx, s.secret); err != nil {
			c.log.Warn().Err(err).Str("operator", s.token.ID).Msg("cannot end a console session")
			c.fail(w, r, &s, http.StatusServiceUnavailable, "PostgreSQL did not end the session (the gateway's log says why); you are still signed in: try again.")
			return
		}
		c.log.Info().Str("operator", s.token.ID).Msg("console: operator signed out")
	}
	c.clearCookie(w)
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// render writes a page: the layout around the named page's content.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, s *session, data map[string]any) {
	data["Page"] = page
	data["Path"] = r.URL.Path
	if s != nil {
		data["Operator"] = s.token
		data["CSRF"] = s.csrf
	}
	var b strings.Builder
	if err := c.pages[page].ExecuteTemplate(&b, "layout.html", data); err != nil {
		c.log.Error().Err(err).Str("page", page).Msg("console: render")
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail renders the error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	c.render(w, r, status, "error", s, map[string]any{"Status": status, "Title": http.StatusText(status), "Message": msg})
}
