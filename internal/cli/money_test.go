package cli

import (
	"strings"
	"testing"

	"github.com/pelguard/pelguard/internal/importer"
)

// TestImportPrintsMoney: import's summary prints a duplicate's amount as
// every other output prints money ("25.00 USD"), not in cents ("2500
// usd"), which read as a hundred times the charge.
func TestImportPrintsMoney(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printImport(&b, importer.Summary{Duplicates: []importer.Duplicate{
		{CustomerID: "c_1", BillingPeriod: "2026-11", ChargeID: "ch_2", CanonicalChargeID: "ch_1", AmountCents: 2500, Currency: "usd"},
		{CustomerID: "c_2", BillingPeriod: "2026-11", ChargeID: "ch_4", CanonicalChargeID: "ch_3", AmountCents: 1999, Currency: "eur"},
	}})
	out := b.String()
	for _, want := range []string{"(25.00 USD)", "(19.99 EUR)", "pelguard-auditor refund"} {
		if !strings.Contains(out, want) {
			t.Errorf("import summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "2500") || strings.Contains(out, "1999") {
		t.Errorf("an amount in cents:\n%s", out)
	}
}
