package stripesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The bulk seed of a separate emulator process: what POST /_sim/seed
// stores is what SeedCharge would, and a malformed body stores nothing
// after the bad element.
func TestAdminSeedInBulk(t *testing.T) {
	t.Parallel()
	srv, _ := setup(t, Config{})
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	created := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	body := `[{"customer":"cus_a","amount":2500,"created":` + itoa(created.Unix()) + `,"metadata":{"pelguard":"1"}},
		{"customer":"cus_b","amount":700,"status":"pending","amount_refunded":0}]`
	resp, err := http.Post(srv.URL()+"/_sim/seed", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		IDs []string `json:"ids"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(out.IDs) != 2 {
		t.Fatalf("status %d, ids %v, err %v", resp.StatusCode, out.IDs, err)
	}
	a, okA := srv.Charge(out.IDs[0])
	b, okB := srv.Charge(out.IDs[1])
	if !okA || !okB || a.Customer != "cus_a" || a.Amount != 2500 || !a.Created.Equal(created) || a.Metadata["pelguard"] != "1" ||
		a.Status != "succeeded" || b.Status != "pending" || b.Amount != 700 {
		t.Fatalf("seeded %+v and %+v", a, b)
	}
	resp, err = http.Post(srv.URL()+"/_sim/seed", "application/json", strings.NewReader(`{"customer":"cus_c"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || len(srv.Charges()) != 2 {
		t.Fatalf("an object instead of an array: status %d, %d charges", resp.StatusCode, len(srv.Charges()))
	}
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }
