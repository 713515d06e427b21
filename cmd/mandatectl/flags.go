package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mandated/mandated/cmd/internal/cli"
)

// The flags: a command's flag set with its help text, the environment
// fallback of the daemon's flags, and the value types mandatectl adds to
// the standard flag package (lists, times, durations with days). What the
// connection flags open is connect.go's.

// flagSet is one command's flags with its help text. Flags registered
// through env() also read their MANDATED_* environment variable, as the
// daemon's do; a command's own flags (--org, --amount, ...) do not, so a
// stray variable in an operator's shell never changes what is sent.
type flagSet struct {
	*flag.FlagSet
	app         *app
	name        string
	synopsis    string
	description string
	examples    []string
	envFlags    map[string]bool
	// docDefaults are the defaults the reference (docs/cli) shows for
	// flags whose default depends on who runs mandatectl.
	docDefaults map[string]string
}

func (a *app) newFlagSet(name, synopsis, description string, examples ...string) *flagSet {
	fs := flag.NewFlagSet("mandatectl "+name, flag.ContinueOnError)
	fs.Usage = func() {}
	fs.SetOutput(a.stderr)
	return &flagSet{FlagSet: fs, app: a, name: name, synopsis: synopsis, description: description,
		examples: examples, envFlags: map[string]bool{}, docDefaults: map[string]string{}}
}

// docDefault says what the reference shows as the default of flag name,
// one the environment decides ("mandatectl:$USER"); --help shows the value.
func (f *flagSet) docDefault(name, text string) { f.docDefaults[name] = text }

// env registers flags that read MANDATED_<FLAG> when not given.
func (f *flagSet) env(register func(fs *flag.FlagSet)) {
	before := map[string]bool{}
	f.VisitAll(func(fl *flag.Flag) { before[fl.Name] = true })
	register(f.FlagSet)
	f.VisitAll(func(fl *flag.Flag) {
		if !before[fl.Name] {
			f.envFlags[fl.Name] = true
		}
	})
}

func (f *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: mandatectl %s %s\n\n%s\n", f.name, f.synopsis, strings.TrimSpace(f.description))
	if len(f.examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, e := range f.examples {
			fmt.Fprint(w, indent(e))
		}
	}
	fmt.Fprintf(w, "\nFlags:\n")
	f.printFlags(w, func(name string) bool { return !f.envFlags[name] })
	if len(f.envFlags) > 0 {
		fmt.Fprintf(w, "\nConnection flags (the daemon's; each also read from MANDATED_<FLAG>, e.g. %s):\n", cli.EnvName("brokers"))
		f.printFlags(w, func(name string) bool { return f.envFlags[name] })
	}
}

// printFlags prints the flags keep selects, in flag.PrintDefaults' format.
func (f *flagSet) printFlags(w io.Writer, keep func(name string) bool) {
	sub := flag.NewFlagSet(f.Name(), flag.ContinueOnError)
	f.VisitAll(func(fl *flag.Flag) {
		if keep(fl.Name) {
			sub.Var(fl.Value, fl.Name, fl.Usage)
			sub.Lookup(fl.Name).DefValue = fl.DefValue
		}
	})
	sub.SetOutput(w)
	sub.PrintDefaults()
}

// parse parses args, allowing flags after positional arguments. It returns
// the positional arguments, or ok=false and the exit code (0 after --help).
func (f *flagSet) parse(args []string) (positional []string, code int, ok bool) {
	for {
		err := f.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp(f.app.stdout)
			return nil, exitOK, false
		}
		if err != nil {
			fmt.Fprintf(f.app.stderr, "run 'mandatectl %s --help' for usage\n", f.name)
			return nil, exitUsage, false
		}
		rest := f.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			positional = append(positional, rest[1:]...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	set := f.given()
	var envErr error
	f.VisitAll(func(fl *flag.Flag) {
		if envErr != nil || set[fl.Name] || !f.envFlags[fl.Name] {
			return
		}
		if v, found := os.LookupEnv(cli.EnvName(fl.Name)); found {
			if err := fl.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", cli.EnvName(fl.Name), v, err)
			}
		}
	})
	if envErr != nil {
		f.app.errorf("%v", envErr)
		return nil, exitUsage, false
	}
	return positional, exitOK, true
}

// given returns the flags given on the command line (not those read from
// the environment).
func (f *flagSet) given() map[string]bool {
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	return set
}

// listFlag is a repeatable flag that also splits on commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// timeFlag is a point in time: RFC 3339, or a duration from now ("90m",
// "7d", "-1h").
type timeFlag struct {
	t   time.Time
	set bool
	now func() time.Time
}

func (f *timeFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.t.Format(time.RFC3339Nano)
}

func (f *timeFlag) Set(s string) error {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		f.t, f.set = t.UTC(), true
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return errors.New("not an RFC 3339 time (2026-12-07T08:00:00Z) or a duration from now (90m, 7d)")
	}
	now := time.Now
	if f.now != nil {
		now = f.now
	}
	f.t, f.set = now().UTC().Add(d).Truncate(time.Millisecond), true
	return nil
}

// parseDuration is time.ParseDuration plus whole days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(strings.TrimPrefix(days, "+"))
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(strings.TrimPrefix(s, "+"))
}

// durationFlag accepts time.ParseDuration's syntax plus days.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string {
	if f == nil {
		return "0s"
	}
	return f.d.String()
}

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	f.d = d
	return nil
}
