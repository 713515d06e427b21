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
	shards, err := db.shards()
	if err != nil {
		return f.usageErr("%v", err)
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
