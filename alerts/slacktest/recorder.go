// Package slacktest is a fake Slack for tests: an HTTP server that accepts
// incoming-webhook posts and chat.postMessage calls, records what it
// received, and can be told to answer 429 with Retry-After, 5xx, a Slack API
// error, or to hang.
package slacktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
)

// Message is one request the recorder received.
type Message struct {
	// Via is "webhook" or "bot".
	Via      string
	Channel  string
	Text     string
	ThreadTS string
	// Blocks is the raw JSON array of Block Kit blocks.
	Blocks json.RawMessage
	// Body is the raw request body, for "no secret anywhere" checks. For the
	// bot it includes the token form field, as Slack requires.
	Body string
	// TS is the ts the recorder answered with (bot only).
	TS string
	// Status is the HTTP status the recorder answered with.
	Status int
}

// Response scripts one answer. The zero value is a normal success.
type Response struct {
	Status     int    // HTTP status; 0 means 200
	RetryAfter string // Retry-After header, e.g. "1"
	APIError   string // bot only: answer 200 {"ok":false,"error":APIError}
	Hang       bool   // block until the client gives up or the recorder closes
}

// Recorder is the fake Slack. Build it with NewRecorder and Close it.
type Recorder struct {
	srv     *httptest.Server
	release chan struct{}

	mu       sync.Mutex
	requests []Message
	script   []Response
	always   *Response
	changed  chan struct{}
	nextTS   int
	closed   bool
}

// NewRecorder starts a recorder on a loopback port.
func NewRecorder() *Recorder {
	r := &Recorder{release: make(chan struct{}), changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /services/", r.handle("webhook"))
	mux.HandleFunc("POST /api/chat.postMessage", r.handle("bot"))
	r.srv = httptest.NewServer(mux)
	return r
}

// WebhookURL is an incoming-webhook URL served by the recorder.
func (r *Recorder) WebhookURL() string { return r.srv.URL + "/services/T000/B000/XXXXXXXXXXXXXXXX" }

// APIURL is the Web API base (for alerts.Config.APIURL).
func (r *Recorder) APIURL() string { return r.srv.URL + "/api" }

// Enqueue scripts the next answers, in order; after them, success.
func (r *Recorder) Enqueue(resps ...Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.script = append(r.script, resps...)
}

// Fail scripts n answers with status and Retry-After (empty for none).
func (r *Recorder) Fail(n, status int, retryAfter string) {
	for range n {
		r.Enqueue(Response{Status: status, RetryAfter: retryAfter})
	}
}

// Always makes every answer, after the scripted ones, resp; nil restores success.
func (r *Recorder) Always(resp *Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.always = resp
}

// HangAll makes every request hang until the client gives up or Close.
func (r *Recorder) HangAll() { r.Always(&Response{Hang: true}) }

// Requests returns every request received, answered or not.
func (r *Recorder) Requests() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.requests...)
}

// Messages returns the requests answered with success: what Slack shows.
func (r *Recorder) Messages() []Message {
	var out []Message
	for _, m := range r.Requests() {
		if m.Status == http.StatusOK && m.TS != "-" {
			out = append(out, m)
		}
	}
	return out
}

// WaitRequests blocks until n requests arrived or ctx ends.
func (r *Recorder) WaitRequests(ctx context.Context, n int) ([]Message, error) {
	return r.wait(ctx, func() []Message { return r.Requests() }, n)
}

// WaitMessages blocks until n successful messages arrived or ctx ends.
func (r *Recorder) WaitMessages(ctx context.Context, n int) ([]Message, error) {
	return r.wait(ctx, func() []Message { return r.Messages() }, n)
}

func (r *Recorder) wait(ctx context.Context, get func() []Message, n int) ([]Message, error) {
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if got := get(); len(got) >= n {
			return got, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return get(), fmt.Errorf("waiting for %d requests, have %d: %w", n, len(get()), ctx.Err())
		}
	}
}

// Close releases hanging requests and stops the server.
func (r *Recorder) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.release)
	}
	r.mu.Unlock()
	r.srv.Close()
}

func (r *Recorder) handle(via string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		m := Message{Via: via, Body: string(body)}
		if via == "webhook" {
			var wm struct {
				Text     string          `json:"text"`
				ThreadTS string          `json:"thread_ts"`
				Channel  string          `json:"channel"`
				Blocks   json.RawMessage `json:"blocks"`
			}
			_ = json.Unmarshal(body, &wm)
			m.Text, m.ThreadTS, m.Channel, m.Blocks = wm.Text, wm.ThreadTS, wm.Channel, wm.Blocks
		} else {
			form, _ := url.ParseQuery(string(body))
			m.Channel, m.Text, m.ThreadTS = form.Get("channel"), form.Get("text"), form.Get("thread_ts")
			if b := form.Get("blocks"); b != "" {
				m.Blocks = json.RawMessage(b)
			}
		}

		r.mu.Lock()
		resp := Response{}
		switch {
		case len(r.script) > 0:
			resp, r.script = r.script[0], r.script[1:]
		case r.always != nil:
			resp = *r.always
		}
		m.Status = resp.Status
		if m.Status == 0 {
			m.Status = http.StatusOK
		}
		if via == "bot" && m.Status == http.StatusOK {
			if resp.APIError != "" {
				m.TS = "-" // answered 200 but not posted
			} else {
				r.nextTS++
				m.TS = fmt.Sprintf("1700000000.%06d", r.nextTS)
			}
		}
		idx := len(r.requests)
		r.requests = append(r.requests, m)
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()

		if resp.Hang {
			// Recorded as failed: the client never gets an answer.
			r.mu.Lock()
			r.requests[idx].Status = 0
			r.mu.Unlock()
			select {
			case <-req.Context().Done():
			case <-r.release:
			}
			return
		}
		if resp.RetryAfter != "" {
			w.Header().Set("Retry-After", resp.RetryAfter)
		}
		switch {
		case m.Status != http.StatusOK:
			w.WriteHeader(m.Status)
			_, _ = io.WriteString(w, http.StatusText(m.Status))
		case via == "webhook":
			_, _ = io.WriteString(w, "ok")
		case resp.APIError != "":
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"ok":false,"error":%s}`, strconv.Quote(resp.APIError))
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "channel": m.Channel, "ts": m.TS})
		}
	}
}
