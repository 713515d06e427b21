package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
)

// The org setting grant_signing (off | required). It is set here by
// 'mandatectl grantor-keys require|relax <org>'; signingSetting is the same
// setting as a flag, for 'mandatectl org-settings set <org> --grant-signing'.

// signingSetting is the --grant-signing flag of org-settings.
type signingSetting struct{ mode string }

func (s *signingSetting) register(fs *flag.FlagSet) {
	fs.StringVar(&s.mode, "grant-signing", "", "grant_signing for the org: required (unsigned grant, revoke and resolve are rejected) or off")
}

// apply stores the setting when the flag was given.
func (s *signingSetting) apply(ctx context.Context, q sink.KeyQuerier, org string) error {
	if s.mode == "" {
		return nil
	}
	mode := sink.SigningMode(s.mode)
	if mode != sink.SigningOff && mode != sink.SigningRequired {
		return fmt.Errorf("--grant-signing must be required or off, not %q", s.mode)
	}
	return admin.SetSigningMode(ctx, q, org, mode)
}

// signingModeCommand is 'grantor-keys require' (mode required) or
// 'grantor-keys relax' (off).
func signingModeCommand(mode sink.SigningMode, summary string) *command {
	verb := map[sink.SigningMode]string{sink.SigningRequired: "require", sink.SigningOff: "relax"}[mode]
	return leafWith(&command{
		name:    verb,
		summary: summary,
		usage:   "<org> [flags]",
		description: fmt.Sprintf(`Set the org's grant_signing to %s. With required, a grant, revoke or
resolve without a valid signature by one of the org's grantor keys is
rejected (signature_missing, ...) and changes nothing; off accepts unsigned
ones (a signature that is present is still verified). Running processors
apply it within --grantor-key-refresh (5s).`, mode),
		examples: []string{"mandatectl grantor-keys " + verb + " acme"},
	}, func() *signingModeOptions { return &signingModeOptions{mode: mode} }, runSigningMode)
}

type signingModeOptions struct {
	mode    sink.SigningMode
	db      dbConn
	timeout time.Duration

	org string
}

func (o *signingModeOptions) register(f *flagSet) {
	o.db.register(f)
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command")
}

func (o *signingModeOptions) validate(in given) error {
	if len(in.args) != 1 || !partitioner.ValidOrg(in.args[0]) {
		return errors.New("want one <org> ([a-z0-9][a-z0-9-]{0,62})")
	}
	o.org = in.args[0]
	_, err := o.db.resolve()
	return err
}

func runSigningMode(ctx context.Context, a *app, o *signingModeOptions) int {
	org, mode := o.org, o.mode
	s := signingSetting{mode: string(mode)}
	return withGrantorKeysConn(ctx, a, &o.db, o.timeout, func(ctx context.Context, q sink.KeyQuerier) error {
		if mode == sink.SigningRequired {
			keys, err := sink.GrantorKeys(ctx, q, org)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				a.errorf("warning: org %s has no grantor keys yet: every grant, revoke and resolve will be rejected until one is added", org)
			}
		}
		if err := s.apply(ctx, q, org); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "grant_signing %s: %s\n", org, mode)
		return nil
	})
}

// signingModeOf returns an org's grant_signing (off when it has no row),
// for 'mandatectl org-settings get'.
func signingModeOf(ctx context.Context, q sink.KeyQuerier, org string) (sink.SigningMode, error) {
	modes, err := sink.SigningModes(ctx, q)
	if err != nil {
		return "", err
	}
	if m, ok := modes[org]; ok {
		return m, nil
	}
	return sink.SigningOff, nil
}
