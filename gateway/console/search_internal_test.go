package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
)

// The search box recognises each kind of value by its shape, or by the
// prefix that names it; a value of no shape is each of the free kinds.
func TestTheSearchBoxRecognisesEachKind(t *testing.T) {
	t.Parallel()
	free := []searchKind{kindKey, kindIntent, kindExecutor, kindRef}
	for _, c := range []struct {
		q     string
		kinds []searchKind
		value string
	}{
		{"au_y7gvrtveevxhkrp5cuy4vssr", []searchKind{kindAuthorization}, "au_y7gvrtveevxhkrp5cuy4vssr"},
		{"3-1042", []searchKind{kindDecision, kindKey}, "3-1042"},
		{"2@5531", []searchKind{kindRecord}, "2@5531"},
		{"proposals 2@5531", []searchKind{kindRecord}, "proposals 2@5531"},
		{"grants:0@17", []searchKind{kindRecord}, "grants:0@17"},
		{"rq-2-5531-c2b6a1f09d3e4f7a8b9c", []searchKind{kindRequest}, "rq-2-5531-c2b6a1f09d3e4f7a8b9c"},
		{"acme/refund-case-1842", append([]searchKind{kindMandate}, free...), "acme/refund-case-1842"},
		{"k-2001", free, "k-2001"},
		{"re_3PqX9a", free, "re_3PqX9a"},
		{"key: 3-1042", []searchKind{kindKey}, "3-1042"},
		{"intent:run-7f3a", []searchKind{kindIntent}, "run-7f3a"},
		{"executor:worker-7f3a.attempt-2", []searchKind{kindExecutor}, "worker-7f3a.attempt-2"},
		{"ref:re_1", []searchKind{kindRef}, "re_1"},
		{"au_short", free, "au_short"},
	} {
		kinds, value := classify(c.q)
		require.Equal(t, c.kinds, kinds, c.q)
		require.Equal(t, c.value, value, c.q)
	}
	p, o, ok := recordOf("rq-2-5531-c2b6a1f09d3e4f7a8b9c")
	require.True(t, ok)
	require.Equal(t, int32(2), p)
	require.Equal(t, int64(5531), o)
	for _, bad := range []string{"3-", "-3", "03-1", "3-0", "a-1", "3-1-2", "99999999999-1"} {
		_, _, ok := parseDecisionID(bad)
		require.False(t, ok, bad)
	}
}

// A search that found one thing goes to it: the authorization every hit is
// about (at the decision, when one decision was found), or the one
// decision without an authorization; anything else is listed.
func TestASearchLeadsToWhatItFound(t *testing.T) {
	t.Parallel()
	k := partitioner.MandateKey{Org: "acme", MandateID: "m-1"}
	hit := func(id, auth string) searchHit {
		return searchHit{V: decisionView{ID: id, Key: k, AuthorizationID: auth}}
	}
	page := "/console/authorizations/acme/m-1/au_1"
	require.Equal(t, page, searchTarget([]searchHit{hit("1-2", "au_1"), hit("1-3", "au_1")}, []searchKind{kindAuthorization}))
	require.Equal(t, page+"#d-1-3", searchTarget([]searchHit{hit("1-3", "au_1")}, []searchKind{kindExecutor}))
	require.Equal(t, page, searchTarget([]searchHit{hit("1-3", "au_1")}, []searchKind{kindAuthorization}))
	require.Equal(t, "/console/decisions/1-4", searchTarget([]searchHit{hit("1-4", "")}, []searchKind{kindKey}))
	require.Empty(t, searchTarget([]searchHit{hit("1-4", ""), hit("1-5", "")}, []searchKind{kindKey}))
	require.Empty(t, searchTarget([]searchHit{hit("1-3", "au_1"), hit("1-4", "")}, []searchKind{kindKey}))
	require.Empty(t, searchTarget([]searchHit{hit("1-3", "au_1"), hit("2-4", "au_2")}, []searchKind{kindIntent}))
	require.Empty(t, searchTarget(nil, []searchKind{kindKey}))
}

// A recorded result reads as lines, amounts by their currency's exponent:
// the contract's money shape and NAME_minor_units beside a currency.
func TestARecordedResultReadsAmountsByTheirCurrency(t *testing.T) {
	t.Parallel()
	rows := resultRows([]byte(`{"amount":{"currency":"EUR","minor_units":15000},"fee_minor_units":250,"currency":"JPY",` +
		`"refund":{"id":"re_1","lines":[1,2]},"ok":true,"n":null}`))
	require.Equal(t, []resultRow{
		{"amount", "150.00 EUR"}, {"fee", "250 JPY"}, {"n", "null"}, {"ok", "true"}, {"refund.id", "re_1"}, {"refund.lines", "[1,2]"},
	}, rows)
	require.Equal(t, []resultRow{{"amount_minor_units", "15000"}, {"currency", "XXY"}},
		resultRows([]byte(`{"amount_minor_units":15000,"currency":"XXY"}`)), "no such currency: left as it is")
	require.Equal(t, []resultRow{{"result", "not json"}}, resultRows([]byte(`not json`)))
	require.Nil(t, resultRows(nil))
}

// A history page's cursor reads back what it wrote; anything else is refused.
func TestAHistoryCursorRoundTrips(t *testing.T) {
	t.Parallel()
	c := sink.HistoryCursor{DecidedAt: time.Date(2026, 12, 3, 20, 1, 2, 345678900, time.UTC), Partition: 3, Seq: 1042}
	got, ok := parseCursor(formatCursor(c))
	require.True(t, ok)
	require.Equal(t, c, *got)
	got, ok = parseCursor("")
	require.True(t, ok)
	require.Nil(t, got)
	for _, bad := range []string{"1.2", "a.b.c", "1.2.3.4", "1.99999999999.3"} {
		_, ok := parseCursor(bad)
		require.False(t, ok, bad)
	}
	require.Equal(t, []int64{2, 2, 5, 10, 20, 50, 100, 200}, []int64{niceCeil(0), niceCeil(2), niceCeil(3), niceCeil(7), niceCeil(11),
		niceCeil(49), niceCeil(51), niceCeil(101)})
}
