package console_test

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway/console"
)

// The console's session is the server's: signing in creates a session
// (its secret in the cookie, only its hash in PostgreSQL), not a copy of
// the operator token; it ends at its expiry and at sign-out, and a
// replayed cookie of an ended session opens nothing.
func TestTheConsoleSessionIsServerSideExpiresAndEndsAtSignOut(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	const ttl = time.Hour
	b := setupWith(t, nil, console.Config{SessionTTL: ttl, Now: clock})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc := &http.Client{Timeout: time.Minute, Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values, cookie *http.Cookie) *http.Response {
		t.Helper()
		req, err := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	get := func(cookie *http.Cookie) *http.Response {
		t.Helper()
		req, err := http.NewRequest("GET", b.base+"/console/", nil)
		require.NoError(t, err)
		req.AddCookie(cookie)
		resp, err := (&http.Client{Timeout: time.Minute, CheckRedirect: hc.CheckRedirect}).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	signIn := func() *http.Cookie {
		t.Helper()
		resp := post("/console/login", url.Values{"token": {b.operator}}, nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		for _, c := range resp.Cookies() {
			if c.Name == console.CookieName {
				return c
			}
		}
		require.Fail(t, "no session cookie")
		return nil
	}

	cookie := signIn()
	require.NotEqual(t, b.operator, cookie.Value, "the cookie is not the operator token")
	require.NotContains(t, cookie.Value, strings.TrimPrefix(b.operator, "mop_"), "nor holds it")
	require.Equal(t, int(ttl/time.Second), cookie.MaxAge, "the cookie lasts as long as the session")
	require.True(t, cookie.HttpOnly)
	require.Equal(t, http.StatusOK, get(cookie).StatusCode)

	// PostgreSQL holds the session's hash, never its secret.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sessions, leaked int
	require.NoError(t, b.rw.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE position($1 in row_to_json(s)::text) > 0)
		FROM console_sessions s`, cookie.Value).Scan(&sessions, &leaked))
	require.Equal(t, 1, sessions)
	require.Zero(t, leaked, "the stored session does not contain the cookie's secret")

	// Sign out: the session ends; the same cookie replayed opens nothing.
	resp := post("/console/logout", url.Values{"csrf": {csrfOf(t, b, hc)}}, nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	replay := get(cookie)
	require.Equal(t, http.StatusSeeOther, replay.StatusCode, "a signed-out session's cookie is refused")
	require.Equal(t, "/console/login", replay.Header.Get("Location"))

	// A new session ends at its expiry.
	cookie = signIn()
	require.Equal(t, http.StatusOK, get(cookie).StatusCode)
	now.Add(int64(ttl - time.Second))
	require.Equal(t, http.StatusOK, get(cookie).StatusCode, "a second before its expiry")
	now.Add(int64(2 * time.Second))
	expired := get(cookie)
	require.Equal(t, http.StatusSeeOther, expired.StatusCode, "a second after its expiry")
	require.Equal(t, "/console/login", expired.Header.Get("Location"))
}
