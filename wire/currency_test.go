package wire_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// Amounts travel in minor units; a person reads them in the currency's
// units, by its ISO 4217 exponent: 100 minor units are 1.00 EUR, 100 JPY
// and 0.100 KWD, never "100 EUR".
func TestFormatAmountUsesTheCurrencysExponent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{100, "EUR", "1.00 EUR"},
		{15000, "EUR", "150.00 EUR"},
		{5, "USD", "0.05 USD"},
		{0, "EUR", "0.00 EUR"},
		{-1999, "EUR", "-19.99 EUR"},
		{100, "JPY", "100 JPY"},
		{100, "KRW", "100 KRW"},
		{100, "KWD", "0.100 KWD"},
		{1234567, "BHD", "1234.567 BHD"},
		{1000000000000000, "EUR", "10000000000000.00 EUR"},
		{math.MaxInt64, "EUR", "92233720368547758.07 EUR"},
		{math.MinInt64, "EUR", "-92233720368547758.08 EUR"},
		{100, "XYZ", "100 minor units of XYZ"},
	} {
		require.Equal(t, tc.want, wire.FormatAmount(tc.minor, tc.currency), "%d %s", tc.minor, tc.currency)
	}
	require.Equal(t, "1.00 EUR", wire.Money{MinorUnits: 100, Currency: "EUR"}.String())
	require.Equal(t, 2, wire.CurrencyExponent("EUR"))
	require.Equal(t, 0, wire.CurrencyExponent("ISK"))
	require.Equal(t, 3, wire.CurrencyExponent("TND"))
	require.Equal(t, -1, wire.CurrencyExponent("EUD"))
}
