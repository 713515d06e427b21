package wire

import (
	"strconv"
	"strings"
)

// iso4217 lists the active ISO 4217 alphabetic currency codes (funds and
// precious-metal codes excluded). A code outside it is refused: a typo such
// as "EUD" must not create a currency no mandate will ever match.
var iso4217 = func() map[string]bool {
	const codes = `AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP BYN BZD
CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD
HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD
MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG
QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD
TZS UAH UGX USD UYU UZS VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG`
	m := map[string]bool{}
	for _, c := range strings.Fields(codes) {
		m[c] = true
	}
	return m
}()

// ValidCurrency reports whether code is an active ISO 4217 code, in upper
// case ("eur" is refused rather than guessed).
func ValidCurrency(code string) bool { return iso4217[code] }

// exponents lists the active codes whose minor unit is not a hundredth
// (ISO 4217's "minor unit" column); every other code in iso4217 has 2.
var exponents = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0, "RWF": 0,
	"UGX": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
}

// CurrencyExponent returns the number of decimal places of code's minor
// unit (2 for EUR, 0 for JPY, 3 for KWD), or -1 for a code outside
// ISO 4217's active list.
func CurrencyExponent(code string) int {
	if !iso4217[code] {
		return -1
	}
	if e, ok := exponents[code]; ok {
		return e
	}
	return 2
}

// FormatAmount writes an amount of minor units as a person reads it, in
// the currency's units by its exponent: FormatAmount(100, "EUR") is
// "1.00 EUR", FormatAmount(100, "JPY") "100 JPY". Every place that shows
// an amount to a person (the console, mandatectl's tables) uses it; JSON
// keeps minor units. A code outside ISO 4217 is shown as minor units,
// never guessed.
func FormatAmount(minor int64, currency string) string {
	e := CurrencyExponent(currency)
	if e < 0 {
		return strconv.FormatInt(minor, 10) + " minor units of " + currency
	}
	sign := ""
	// The magnitude as an unsigned number: -MinInt64 does not fit an int64.
	mag := uint64(minor)
	if minor < 0 {
		sign, mag = "-", uint64(-(minor+1))+1
	}
	digits := strconv.FormatUint(mag, 10)
	if e == 0 {
		return sign + digits + " " + currency
	}
	if len(digits) <= e {
		digits = strings.Repeat("0", e-len(digits)+1) + digits
	}
	return sign + digits[:len(digits)-e] + "." + digits[len(digits)-e:] + " " + currency
}

// String is the amount as FormatAmount writes it.
func (m Money) String() string { return FormatAmount(m.MinorUnits, m.Currency) }
