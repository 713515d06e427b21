package main

import (
	"context"
	"fmt"
	"time"

	"github.com/mandated/mandated/sink"
)

func migrateCommand() *command {
	return leaf(&command{
		name:    "migrate",
		group:   groupSetup,
		summary: "apply the embedded schema migrations (--print shows them)",
		usage:   "[--print] [flags]",
		description: `Apply the schema migrations embedded in this binary that the database has
not recorded yet, each in its own transaction, under an advisory lock (so
several migrators, or a migrator and starting daemons, apply each step once).
The daemon applies them at start as well; running this first, as a one-shot
job, keeps schema changes out of the rolling restart.

--print prints the embedded schema instead and needs no database.`,
		examples: []string{
			"mandatectl migrate --database-url postgres://mandated@db:5432/mandated?sslmode=verify-full",
			"MANDATED_DATABASE_URL=postgres://... mandatectl migrate",
			"mandatectl migrate --print > schema.sql",
		},
	}, runMigrate)
}

type migrateOptions struct {
	db      dbConn
	print   bool
	timeout time.Duration
}

func (o *migrateOptions) register(f *flagSet) {
	o.db.register(f)
	f.BoolVar(&o.print, "print", false, "print the embedded migrations (SQL) and exit")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on the whole migration")
}

func (o *migrateOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.print { // needs no database
		return nil
	}
	_, err := o.db.resolve()
	return err
}

func runMigrate(ctx context.Context, a *app, o *migrateOptions) int {
	migrations, err := sink.Migrations()
	if err != nil {
		a.errorf("migrate: %v", err)
		return exitFailed
	}
	if o.print {
		for _, m := range migrations {
			fmt.Fprintf(a.stdout, "-- migration %d: %s\n%s\n", m.Version, m.Name, m.SQL)
		}
		return exitOK
	}
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	shards, err := o.db.shards()
	if err != nil {
		return a.usageErr("%v", err)
	}
	names := map[int]string{}
	for _, m := range migrations {
		names[m.Version] = m.Name
	}
	latest := migrations[len(migrations)-1]
	for _, one := range shards {
		// With a shard map every shard has its own schema, migrated in turn.
		prefix := ""
		if one.name() != "" {
			prefix = "shard " + one.name() + ": "
		}
		conn, err := one.conn(ctx)
		if err != nil {
			a.errorf("migrate: %s%v", prefix, err)
			return exitFailed
		}
		applied, err := sink.Migrate(ctx, conn)
		conn.Close(context.WithoutCancel(ctx))
		for _, v := range applied {
			fmt.Fprintf(a.stdout, "%sapplied %s\n", prefix, names[v])
		}
		if err != nil {
			a.errorf("migrate: %s%v", prefix, err)
			return exitFailed
		}
		if len(applied) == 0 {
			fmt.Fprintf(a.stdout, "%sschema is up to date (version %d, %s)\n", prefix, latest.Version, latest.Name)
		} else {
			fmt.Fprintf(a.stdout, "%sschema is at version %d\n", prefix, latest.Version)
		}
	}
	return exitOK
}
