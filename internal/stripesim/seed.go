package stripesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// SeedJSON is one charge of POST /_sim/seed: ChargeSeed in snake_case,
// created in Unix seconds.
type SeedJSON struct {
	Customer       string            `json:"customer"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency,omitempty"`
	Created        int64             `json:"created,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	Description    string            `json:"description,omitempty"`
	Status         string            `json:"status,omitempty"`
	AmountRefunded int64             `json:"amount_refunded,omitempty"`
	PaymentIntent  string            `json:"payment_intent,omitempty"`
	ViaIntent      bool              `json:"via_intent,omitempty"`
	Disputed       bool              `json:"disputed,omitempty"`
}

// Seed converts j to the ChargeSeed that SeedCharge takes.
func (j SeedJSON) Seed() ChargeSeed {
	s := ChargeSeed{Customer: j.Customer, Amount: j.Amount, Currency: j.Currency, Metadata: j.Metadata,
		Description: j.Description, Status: j.Status, AmountRefunded: j.AmountRefunded,
		PaymentIntent: j.PaymentIntent, ViaIntent: j.ViaIntent, Disputed: j.Disputed}
	if j.Created != 0 {
		s.Created = time.Unix(j.Created, 0)
	}
	return s
}

// serveSeed answers POST /_sim/seed, a JSON array of SeedJSON: the bulk
// seed of a separate emulator process (a million charges for the auditor's
// benchmark costs seconds, not a million POST /v1/charges). The array is
// decoded one element at a time, so a large body is never held whole. It
// returns the ids in order.
func (s *Server) serveSeed(r *http.Request) (int, any, bool) {
	if r.Method != http.MethodPost || r.URL.Path != "/_sim/seed" {
		return 0, nil, false
	}
	dec := json.NewDecoder(r.Body)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return http.StatusBadRequest, map[string]string{"error": "seed: the body must be a JSON array of charges"}, true
	}
	var ids []string
	for dec.More() {
		var j SeedJSON
		if err := dec.Decode(&j); err != nil {
			return http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("seed: charge %d: %v", len(ids), err)}, true
		}
		ids = append(ids, s.SeedCharge(j.Seed()).ID)
	}
	return http.StatusOK, map[string]any{"ids": ids}, true
}
