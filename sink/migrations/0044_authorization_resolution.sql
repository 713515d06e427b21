-- A resolved in-doubt execution keeps its story (issue 32): detail holds
-- the command that last moved it (a resolve's evidence), so what was
-- reported when it went in doubt (report_unknown's detail, or the
-- execution timeout's) is kept in reported, and the reconciler that
-- resolved it (the resolve's reconciler member) in resolved_by. Both are
-- also in every decision's authorization view.
ALTER TABLE authorizations
    ADD COLUMN reported    text NOT NULL DEFAULT '',
    ADD COLUMN resolved_by text NOT NULL DEFAULT '';
