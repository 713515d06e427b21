package main

import (
	"context"
	"fmt"
	"time"

	"github.com/mandated/mandated/sink"
)

func runMigrate(a *app, args []string) int {
	f := a.newFlagSet("migrate", "[--print] [flags]",
		`Apply the schema migrations embedded in this binary that the database has
not recorded yet, each in its own transaction, under an advisory lock (so
several migrators, or a migrator and starting daemons, apply each step once).
The daemon applies them at start as well; running this first, as a one-shot
job, keeps schema changes out of the rolling restart.

--print prints the embedded schema instead and needs no database.`,
		"mandatectl migrate --database-url postgres://mandated@db:5432/mandated?sslmode=verify-full",
		"MANDATED_DATABASE_URL=postgres://... mandatectl migrate",
		"mandatectl migrate --print > schema.sql")
	var db dbConn
	db.register(f)
	print := f.Bool("print", false, "print the embedded migrations (SQL) and exit")
	timeout := f.Duration("timeout", 5*time.Minute, "bound on the whole migration")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	migrations, err := sink.Migrations()
	if err != nil {
		a.errorf("migrate: %v", err)
		return exitFailed
	}
	if *print {
		for _, m := range migrations {
			fmt.Fprintf(a.stdout, "-- migration %d: %s\n%s\n", m.Version, m.Name, m.SQL)
		}
		return exitOK
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("migrate: %v", err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	applied, err := sink.Migrate(ctx, conn)
	names := map[int]string{}
	for _, m := range migrations {
		names[m.Version] = m.Name
	}
	for _, v := range applied {
		fmt.Fprintf(a.stdout, "applied %s\n", names[v])
	}
	if err != nil {
		a.errorf("migrate: %v", err)
		return exitFailed
	}
	latest := migrations[len(migrations)-1]
	if len(applied) == 0 {
		fmt.Fprintf(a.stdout, "schema is up to date (version %d, %s)\n", latest.Version, latest.Name)
	} else {
		fmt.Fprintf(a.stdout, "schema is at version %d\n", latest.Version)
	}
	return exitOK
}
