package cli

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/redact"
	"github.com/pelguard/pelguard/internal/streamfacts"
)

// Agreement is what a role must agree on with the rest of its streams'
// fleet before it touches anything (DESIGN.md invariant 14): the namespace
// each stream records. Record: the role may record it for a stream used
// for the first time (a dry run and the console write nothing).
type Agreement struct {
	Namespace string
	Streams   []streamfacts.Stream
	Record    bool
	By        string
}

// Check refuses (a UsageError: exit 2) a role whose namespace is not its
// streams'.
func (a Agreement) Check(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, schema string) error {
	if len(a.Streams) == 0 {
		return nil
	}
	err := streamfacts.Check{DB: pool, Schema: schema, Redis: rdb, Namespace: a.Namespace, Streams: a.Streams,
		Record: a.Record, By: a.By}.Run(ctx)
	if errors.Is(err, streamfacts.ErrDisagree) {
		return Usagef("%v", err)
	}
	if err != nil {
		return redact.Error(err)
	}
	return nil
}

// ChargeStreams are sgs as streams of charges.
func ChargeStreams(sgs []StreamGroup) []streamfacts.Stream {
	return asStreams(sgs, streamfacts.Charges)
}

// UsageStreams are sgs as streams of meter events.
func UsageStreams(sgs []StreamGroup) []streamfacts.Stream { return asStreams(sgs, streamfacts.Usage) }

func asStreams(sgs []StreamGroup, k streamfacts.Kind) []streamfacts.Stream {
	out := make([]streamfacts.Stream, len(sgs))
	for i, sg := range sgs {
		out[i] = streamfacts.Stream{Name: sg.Stream, Group: sg.Group, Kind: k}
	}
	return out
}
