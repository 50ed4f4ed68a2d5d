package stripesim

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// idemKey scopes idempotency keys to the API key, as Stripe scopes them to
// the account and mode.
type idemKey struct {
	apiKey string
	key    string
}

// idemEntry is one Idempotency-Key's state: running until finish records the
// response (or forgets the key when the response must not be cached).
type idemEntry struct {
	k    idemKey
	fp   string
	at   time.Time
	done bool
	resp response
}

// drop forgets every recorded response.
func (s *idemStore) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries, s.fifo, s.head = make(map[idemKey]*idemEntry), nil, 0
}

type idemStore struct {
	mu      sync.Mutex
	entries map[idemKey]*idemEntry
	// fifo lists entries in creation order so expired ones are swept in
	// amortised O(1) instead of scanning the map.
	fifo []*idemEntry
	head int
}

func newIdemStore() *idemStore {
	return &idemStore{entries: make(map[idemKey]*idemEntry)}
}

// begin claims key for a request whose parameters hash to fp. Exactly one
// result is set: ent (caller executes and must call finish), replay (the
// recorded response), or errResp (mismatch or key in use).
func (st *idemStore) begin(apiKey, key, fp string, now time.Time) (ent *idemEntry, replay *response, errResp response) {
	k := idemKey{apiKey, key}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweep(now)
	if e := st.entries[k]; e != nil && !(e.done && expired(e, now)) {
		if e.fp != fp {
			return nil, nil, errorResp(http.StatusBadRequest, stripeError{
				Type: "idempotency_error",
				Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same parameters they were first used with. "+
					"Try using a key other than '%s' if you meant to execute a different request.", key),
			})
		}
		if !e.done {
			// Stripe answers 409 with code idempotency_key_in_use. We use
			// type idempotency_error so stripe-go yields *IdempotencyError;
			// callers should branch on the code or the 409 status.
			return nil, nil, errorResp(http.StatusConflict, stripeError{
				Type: "idempotency_error", Code: "idempotency_key_in_use",
				Message: "There is currently another in-progress request using this Idempotent Key (that probably means you " +
					"submitted twice, and the other request is still going through): " + key + ". Please try again later.",
			})
		}
		r := e.resp
		return nil, &r, response{}
	}
	e := &idemEntry{k: k, fp: fp, at: now}
	st.entries[k] = e
	st.fifo = append(st.fifo, e)
	return e, nil, response{}
}

// finish records resp for replay, or releases the key when resp is not
// cacheable (validation errors), so a corrected retry may reuse it.
func (st *idemStore) finish(e *idemEntry, resp response) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if resp.cache {
		e.done, e.resp = true, resp
		return
	}
	if st.entries[e.k] == e {
		delete(st.entries, e.k)
	}
}

func expired(e *idemEntry, now time.Time) bool {
	return !now.Before(e.at.Add(IdempotencyWindow))
}

// sweep drops finished entries older than the window from the front of the
// fifo. If the clock is set backwards entries are swept late, never early.
func (st *idemStore) sweep(now time.Time) {
	for st.head < len(st.fifo) {
		e := st.fifo[st.head]
		if e.done && !expired(e, now) {
			break
		}
		if !e.done && st.entries[e.k] == e {
			break // still running: keep it and everything after it
		}
		if st.entries[e.k] == e {
			delete(st.entries, e.k)
		}
		st.fifo[st.head] = nil
		st.head++
	}
	if st.head > 1024 && st.head*2 > len(st.fifo) {
		st.fifo = append([]*idemEntry(nil), st.fifo[st.head:]...)
		st.head = 0
	}
}

// len reports live keys; used by tests.
func (st *idemStore) len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.entries)
}
