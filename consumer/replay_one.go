package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrNoDeadLetter: the dead letter is not (or no longer) in <stream>:dead —
// replayed already, or never there.
var ErrNoDeadLetter = errors.New("no such dead letter")

// ReplayDeadLetter puts the one dead letter deadID of stream back on the
// stream, exactly as ReplayDeadLetters does for each of a reason's: its
// original fields without the dead-letter ones, then XDEL from
// <stream>:dead. A dead letter already replayed is ErrNoDeadLetter. Two
// replays of one entry racing can both XADD (the stream and its dead
// letters may sit on different Cluster slots, so no script can make it
// atomic); the ledger absorbs the second (already billed → acked), and the
// console serialises its own replays on the action's token.
func ReplayDeadLetter(ctx context.Context, rdb redis.UniversalClient, stream, deadID string) (Replayed, error) {
	msgs, err := rdb.XRangeN(ctx, DeadLetterStream(stream), deadID, deadID, 1).Result()
	if err != nil {
		return Replayed{}, fmt.Errorf("reading %s %s: %w", DeadLetterStream(stream), deadID, err)
	}
	if len(msgs) == 0 {
		return Replayed{}, fmt.Errorf("%s %s: %w", DeadLetterStream(stream), deadID, ErrNoDeadLetter)
	}
	m := msgs[0]
	rep := Replayed{DeadID: m.ID}
	rep.Reason, _ = m.Values["reason"].(string)
	rep.SourceID, _ = m.Values["source_id"].(string)
	values := make(map[string]any, len(m.Values))
	for k, v := range m.Values {
		values[k] = v
	}
	for _, k := range deadLetterMeta {
		delete(values, k)
	}
	// As ReplayDeadLetters: without it, a parked action_required or failed
	// row's replay is acked as already billed and nobody is charged.
	values[ReplayedFromField] = m.ID
	if rep.NewID, err = rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Result(); err != nil {
		return rep, fmt.Errorf("replaying %s onto %s: %w", m.ID, stream, err)
	}
	if err := rdb.XDel(ctx, DeadLetterStream(stream), m.ID).Err(); err != nil {
		return rep, fmt.Errorf("removing replayed dead letter %s: %w", m.ID, err)
	}
	return rep, nil
}
