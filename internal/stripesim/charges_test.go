package stripesim

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
)

func TestChargeCreateAndRetrieve(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	cus, err := sc.Customers.New(&stripe.CustomerParams{Email: stripe.String("a@example.com")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := sc.Customers.Get(cus.ID, nil)
	if err != nil || got.Email != "a@example.com" {
		t.Fatalf("customer get = %+v, %v", got, err)
	}
	ch, err := sc.Charges.New(newChargeParams(cus.ID, 1234, ""))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Status != stripe.ChargeStatusSucceeded || !ch.Paid || ch.Amount != 1234 || ch.Customer.ID != cus.ID ||
		ch.Metadata["billing_period"] != "2024-04" || ch.Created != t0.Unix() || ch.Currency != "usd" {
		t.Fatalf("unexpected charge %+v", ch)
	}
	again, err := sc.Charges.Get(ch.ID, nil)
	if err != nil || again.ID != ch.ID || again.Description != "Usage billing for 2024-04" {
		t.Fatalf("get = %+v, %v", again, err)
	}
	_, err = sc.Charges.Get("ch_missing", nil)
	if se := stripeErr(t, err, http.StatusNotFound); se.Code != stripe.ErrorCodeResourceMissing {
		t.Fatalf("code = %s", se.Code)
	}
	if n := srv.ChargeCreates(); n != 1 {
		t.Fatalf("ChargeCreates = %d", n)
	}
	if n := srv.Requests()["POST /v1/charges"]; n != 1 {
		t.Fatalf("requests = %v", srv.Requests())
	}
	_, err = sc.Charges.New(&stripe.ChargeParams{Currency: stripe.String("usd")})
	if se := stripeErr(t, err, http.StatusBadRequest); se.Code != stripe.ErrorCodeParameterMissing {
		t.Fatalf("code = %s", se.Code)
	}
}

func TestRequireCustomers(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{RequireCustomers: true})
	_, err := sc.Charges.New(newChargeParams("cus_nope", 100, ""))
	stripeErr(t, err, http.StatusBadRequest)
	cus := srv.CreateCustomer(CustomerSeed{Email: "b@example.com"})
	if _, err := sc.Charges.New(newChargeParams(cus.ID, 100, "")); err != nil {
		t.Fatal(err)
	}
}

// seedSpread creates n charges through stripe-go for two customers, ten per
// emulator second, so created ties exist and must be broken by insertion.
func seedSpread(t *testing.T, srv *Server, sc interface {
	New(*stripe.ChargeParams) (*stripe.Charge, error)
}, n int) []*stripe.Charge {
	t.Helper()
	var out []*stripe.Charge
	for i := range n {
		if i > 0 && i%10 == 0 {
			srv.Advance(time.Second)
		}
		ch, err := sc.New(newChargeParams([]string{"cus_a", "cus_b"}[i%2], int64(100+i), ""))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ch)
	}
	return out
}

func ids(chs []*stripe.Charge) []string {
	out := make([]string, len(chs))
	for i, c := range chs {
		out[i] = c.ID
	}
	return out
}

func listAll(t *testing.T, it interface {
	Next() bool
	Charge() *stripe.Charge
	Err() error
}) []*stripe.Charge {
	t.Helper()
	var out []*stripe.Charge
	for it.Next() {
		out = append(out, it.Charge())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestListOrderingFiltersAndPagination(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	created := seedSpread(t, srv, sc.Charges, 250)
	newestFirst := slices.Clone(created)
	slices.Reverse(newestFirst)

	t.Run("auto-pagination returns all newest first", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.Limit = stripe.Int64(7)
		got := listAll(t, sc.Charges.List(params))
		if !slices.Equal(ids(got), ids(newestFirst)) {
			t.Fatalf("order mismatch: got %d charges, first %v", len(got), ids(got)[:3])
		}
		if srv.Requests()["GET /v1/charges"] != 36 { // ceil(250/7)
			t.Fatalf("pages = %d", srv.Requests()["GET /v1/charges"])
		}
	})
	t.Run("default limit and has_more", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.Single = true
		it := sc.Charges.List(params)
		got := listAll(t, it)
		if len(got) != 10 || !it.Meta().HasMore || it.Meta().URL != "/v1/charges" {
			t.Fatalf("len %d meta %+v", len(got), it.Meta())
		}
	})
	t.Run("created range", func(t *testing.T) {
		// Seconds t0+5 .. t0+9 inclusive hold charges 50..99.
		params := &stripe.ChargeListParams{CreatedRange: &stripe.RangeQueryParams{
			GreaterThan: t0.Unix() + 4, LesserThanOrEqual: t0.Unix() + 9,
		}}
		got := listAll(t, sc.Charges.List(params))
		want := slices.Clone(created[50:100])
		slices.Reverse(want)
		if !slices.Equal(ids(got), ids(want)) {
			t.Fatalf("got %d charges", len(got))
		}
		params = &stripe.ChargeListParams{CreatedRange: &stripe.RangeQueryParams{
			GreaterThanOrEqual: t0.Unix() + 5, LesserThan: t0.Unix() + 6,
		}}
		if got := listAll(t, sc.Charges.List(params)); len(got) != 10 {
			t.Fatalf("gte/lt got %d", len(got))
		}
		params = &stripe.ChargeListParams{Created: stripe.Int64(t0.Unix() + 24)}
		if got := listAll(t, sc.Charges.List(params)); len(got) != 10 {
			t.Fatalf("exact created got %d", len(got))
		}
	})
	t.Run("customer filter", func(t *testing.T) {
		params := &stripe.ChargeListParams{Customer: stripe.String("cus_b")}
		params.Limit = stripe.Int64(100)
		got := listAll(t, sc.Charges.List(params))
		if len(got) != 125 {
			t.Fatalf("got %d", len(got))
		}
		for i, ch := range got {
			if ch.Customer.ID != "cus_b" || (i > 0 && ch.ID >= got[i-1].ID) {
				t.Fatalf("bad charge %d: %s %s", i, ch.ID, ch.Customer.ID)
			}
		}
	})
	t.Run("ending_before walks backwards", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.EndingBefore = stripe.String(created[100].ID)
		params.Limit = stripe.Int64(9)
		got := listAll(t, sc.Charges.List(params))
		if !slices.Equal(ids(got), ids(created[101:])) {
			t.Fatalf("got %d charges, first %v", len(got), ids(got)[:2])
		}
	})
	t.Run("starting_after from the middle", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.StartingAfter = stripe.String(created[100].ID)
		got := listAll(t, sc.Charges.List(params))
		want := slices.Clone(created[:100])
		slices.Reverse(want)
		if !slices.Equal(ids(got), ids(want)) {
			t.Fatalf("got %d", len(got))
		}
	})
	t.Run("limit above 100 is refused", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.Limit = stripe.Int64(101)
		it := sc.Charges.List(params)
		it.Next()
		stripeErr(t, it.Err(), http.StatusBadRequest)
	})
	t.Run("unknown cursor is refused", func(t *testing.T) {
		params := &stripe.ChargeListParams{}
		params.StartingAfter = stripe.String("ch_nope")
		it := sc.Charges.List(params)
		it.Next()
		stripeErr(t, it.Err(), http.StatusBadRequest)
	})
}

func TestSeedOutOfOrderListsSorted(t *testing.T) {
	t.Parallel()
	srv, sc := setup(t, Config{})
	for _, off := range []int{5, 1, 9, 3, 3, 0} {
		srv.SeedCharge(ChargeSeed{Customer: "cus_s", Amount: 100, Created: t0.Add(time.Duration(off) * time.Hour),
			Description: fmt.Sprintf("off %d", off)})
	}
	got := listAll(t, sc.Charges.List(&stripe.ChargeListParams{}))
	var descs []string
	for _, ch := range got {
		descs = append(descs, ch.Description)
	}
	if strings.Join(descs, ",") != "off 9,off 5,off 3,off 3,off 1,off 0" {
		t.Fatalf("order %v", descs)
	}
	if got[2].ID < got[3].ID {
		t.Fatalf("tie not broken newest-insert first: %s %s", got[2].ID, got[3].ID)
	}
	if n := len(srv.Charges()); n != 6 {
		t.Fatalf("Charges() = %d", n)
	}
}

func TestUpdateChargeMetadata(t *testing.T) {
	t.Parallel()
	_, sc := setup(t, Config{})
	ch, err := sc.Charges.New(newChargeParams("cus_u", 100, ""))
	if err != nil {
		t.Fatal(err)
	}
	p := &stripe.ChargeParams{}
	p.AddMetadata("audited", "yes")
	p.AddMetadata("billing_period", "")
	up, err := sc.Charges.Update(ch.ID, p)
	if err != nil || up.Metadata["audited"] != "yes" || up.Metadata["customer_id"] == "" {
		t.Fatalf("update = %+v, %v", up.Metadata, err)
	}
	if _, ok := up.Metadata["billing_period"]; ok {
		t.Fatal("empty value should delete the key")
	}
}
