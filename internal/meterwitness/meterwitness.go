// Package meterwitness keeps, in Redis, what pelguard recorded of each meter
// event before acking its entry (DESIGN.md "Usage after a ledger
// rollback"): the usage repair's source after a Postgres failover that lost
// delivered rows. Stripe has no listing of single meter events, and the
// entries are acked, so without it a lost delivered row would never come
// back and its customer's ledger would stay short of Stripe.
//
// Each meter stream and group has a sorted set, Key(stream, group), on the
// stream's slot (it carries the stream's hash tag): one member per event
// acked delivered or parked, scored by the time of the ack (milliseconds of
// the writer's clock). It is written before the XACK, on the same Redis
// node as the stream: an AOF or replica rollback loses a suffix of that
// node's writes, so an ack that survives has its witness too, and one that
// is lost brings its entry back pending to be decided again. Members older
// than Retention are pruned by the writers, never while a ledger rollback
// is unrepaired, and the bound pruned below is kept in the set (member
// prunedMember), so a repair knows how far back the witness reaches.
//
// The registry (RegistryKey of the ledger's id) names every meter stream
// and group that writes one, with its namespace, for the repair to find.
package meterwitness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Retention is how long a witness member is kept after its ack: the
// farthest back a repair can restore from it. A rollback's loss begins at
// the last surviving ledger commit less rollback.DefaultMargin (5 min),
// so this covers replication lag up to about 1 h 55 min; pruning stops
// while a rollback is open, so an outage before the repair costs nothing.
const Retention = 2 * time.Hour

// Status of a witnessed event.
const (
	Delivered = "delivered"
	Parked    = "parked"
	// Queued: recorded at ingest and acked, maybe not sent yet (a consumer
	// that sends from the ledger). FirstSentAt is the ingest: no attempt
	// of the event is older.
	Queued = "queued"
	// Aggregate: an aggregate of a sum meter's events of one second,
	// witnessed before its first call: Identifier and Value are the
	// aggregate's, Members its members' identifiers, Digest their digest.
	// The repair never re-sends a member of a witnessed aggregate on its
	// own: it would count twice.
	Aggregate = "aggregate"
)

// prunedMember holds, as its score, the bound below which members were
// pruned.
const prunedMember = "~pruned"

// Sent is one event as it was recorded before its ack.
type Sent struct {
	Status           string    `json:"s"`
	EventTS          time.Time `json:"-"`
	Identifier       string    `json:"i"`
	EventName        string    `json:"e"`
	StripeCustomerID string    `json:"c"`
	CustomerID       string    `json:"u,omitempty"`
	Value            int64     `json:"v"`
	FirstSentAt      time.Time `json:"-"`
	MessageID        string    `json:"m,omitempty"`
	Reason           string    `json:"r,omitempty"`
	Members          []string  `json:"g,omitempty"`
	Digest           string    `json:"d,omitempty"`
	// At is when it was witnessed (the member's score); set by Read.
	At time.Time `json:"-"`
}

type wire struct {
	Sent
	TS    int64 `json:"t"`
	First int64 `json:"f,omitempty"`
}

func (s Sent) member() (string, error) {
	w := wire{Sent: s, TS: s.EventTS.UnixMilli()}
	if !s.FirstSentAt.IsZero() {
		w.First = s.FirstSentAt.UnixMicro()
	}
	b, err := json.Marshal(w)
	return string(b), err
}

func parse(member string, score float64) (Sent, error) {
	var w wire
	if err := json.Unmarshal([]byte(member), &w); err != nil {
		return Sent{}, err
	}
	s := w.Sent
	s.EventTS = time.UnixMilli(w.TS).UTC()
	if w.First != 0 {
		s.FirstSentAt = time.UnixMicro(w.First).UTC()
	}
	s.At = time.UnixMilli(int64(score)).UTC()
	if s.Identifier == "" || s.EventName == "" || s.StripeCustomerID == "" || (s.Status != Delivered && s.Status != Parked && s.Status != Queued && s.Status != Aggregate) {
		return Sent{}, fmt.Errorf("incomplete member")
	}
	return s, nil
}

// Stream is one meter stream and group that writes a witness.
type Stream struct {
	Stream    string `json:"stream"`
	Group     string `json:"group"`
	Namespace string `json:"namespace"`
}

// Key is the witness of stream's group: on the stream's slot when the
// stream name carries a hash tag (as Redis Cluster needs anyway).
func Key(stream, group string) string { return stream + ":pelguard:meter-sent:" + group }

// RegistryKey names the meter streams witnessed for the ledger ledgerID
// (ledger_fence.ledger_id): two ledgers sharing a Redis never restore each
// other's events.
func RegistryKey(ledgerID string) string { return "pelguard:meter-sent-streams:" + ledgerID }

// Record writes sent to s's witness at now, registers s for ledgerID, and,
// when prune is set, drops the members older than Retention. Call it after
// the ledger write has committed and before the XACK, and do not ack if it
// fails. The SADD and the ZADD are sent in one pipeline; a Cluster client
// splits it by slot, and the witness lands on the stream's node.
func Record(ctx context.Context, rdb redis.UniversalClient, ledgerID string, s Stream, sent []Sent, now time.Time, prune bool) error {
	if len(sent) == 0 {
		return nil
	}
	if ledgerID == "" {
		return errors.New("meter witness: the ledger's id is required")
	}
	reg, err := json.Marshal(s)
	if err != nil {
		return err
	}
	key := Key(s.Stream, s.Group)
	score := float64(now.UnixMilli())
	zs := make([]redis.Z, 0, len(sent)+1)
	for _, e := range sent {
		m, err := e.member()
		if err != nil {
			return fmt.Errorf("meter witness: encoding %s: %w", e.Identifier, err)
		}
		zs = append(zs, redis.Z{Score: score, Member: m})
	}
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, RegistryKey(ledgerID), string(reg))
		if prune {
			bound := now.Add(-Retention).UnixMilli()
			p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(bound, 10))
			zs = append(zs, redis.Z{Score: float64(bound), Member: prunedMember})
		}
		p.ZAdd(ctx, key, zs...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing the meter witness of %s/%s: %w", s.Stream, s.Group, err)
	}
	return nil
}

// Streams reads the registry of ledgerID.
func Streams(ctx context.Context, rdb redis.UniversalClient, ledgerID string) ([]Stream, error) {
	ms, err := rdb.SMembers(ctx, RegistryKey(ledgerID)).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the meter witness registry: %w", err)
	}
	out := make([]Stream, 0, len(ms))
	for _, m := range ms {
		var s Stream
		if json.Unmarshal([]byte(m), &s) == nil && s.Stream != "" && s.Group != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// Read returns the events witnessed on s at or after since, oldest first,
// and the bound below which members were pruned (zero: never pruned).
// Members it cannot read are counted in bad.
func Read(ctx context.Context, rdb redis.UniversalClient, s Stream, since time.Time) (sent []Sent, prunedBelow time.Time, bad int, err error) {
	key := Key(s.Stream, s.Group)
	if sc, err := rdb.ZScore(ctx, key, prunedMember).Result(); err == nil {
		prunedBelow = time.UnixMilli(int64(sc)).UTC()
	} else if !errors.Is(err, redis.Nil) {
		return nil, time.Time{}, 0, fmt.Errorf("reading the meter witness of %s/%s: %w", s.Stream, s.Group, err)
	}
	const page = 1000
	min := strconv.FormatInt(since.UnixMilli(), 10)
	for offset := int64(0); ; offset += page {
		zs, err := rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: min, Max: "+inf", Offset: offset, Count: page}).Result()
		if err != nil {
			return nil, time.Time{}, 0, fmt.Errorf("reading the meter witness of %s/%s: %w", s.Stream, s.Group, err)
		}
		for _, z := range zs {
			m, _ := z.Member.(string)
			if m == prunedMember {
				continue
			}
			e, err := parse(m, z.Score)
			if err != nil {
				bad++
				continue
			}
			sent = append(sent, e)
		}
		if len(zs) < page {
			return sent, prunedBelow, bad, nil
		}
	}
}
