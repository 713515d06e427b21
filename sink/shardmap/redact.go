package shardmap

import "regexp"

var (
	// userinfo's password in a URL: scheme://user:PASSWORD@host
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s"'` + "`" + `]*:)[^@\s"'` + "`" + `]*@`)
	// a keyword/value connection string's password: password=PASSWORD,
	// password='PASS WORD'; and a URL's query parameter ?password=PASSWORD
	kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&"'` + "`" + `]+)`)
)

// RedactSecrets replaces every password in text — of a connection URL
// (postgres://user:PASSWORD@host, ?password=PASSWORD) or a keyword/value
// connection string (password=PASSWORD) — with "***". mandatectl passes
// everything it prints about databases and shard maps through it: an error
// may quote a URL, and a shard map's url: entries carry credentials.
func RedactSecrets(text string) string {
	text = urlPassword.ReplaceAllString(text, "${1}***@")
	return kvPassword.ReplaceAllString(text, "${1}***")
}
