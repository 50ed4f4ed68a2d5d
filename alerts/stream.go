package alerts

import (
	"fmt"
	"strconv"
	"time"
)

// The kinds about what a stream holds.
const (
	// KindStreamEntriesLost: entries were removed from a stream before a
	// consumer group read them (a producer's MAXLEN, someone's XTRIM or
	// XDEL), or pending entries were acked because their bodies were gone.
	// Those events were never billed by that group.
	KindStreamEntriesLost Kind = "stream_entries_lost"
	// KindDeadLettersWaiting: a dead-letter stream holds more entries, or
	// an older one, than the reaper's --dead-letter-max or
	// --dead-letter-max-age; they wait for a person (replay or discard).
	KindDeadLettersWaiting Kind = "dead_letters_waiting"
)

// StreamLoss is one loss the reaper saw on a stream.
type StreamLoss struct {
	Stream, Group string
	// Count is how many entries were lost; -1 when Redis cannot tell
	// (the group's lag is unknown after an XDEL inside its unread range).
	Count int64
	// After and Before bound the lost ids: every entry above After and
	// below Before that the stream held is gone.
	After, Before string
	// Pending is how many of the group's pending entries lie below the
	// stream's first entry (trimmed while pending; the reaper acks them as
	// gone).
	Pending int64
	// Gone is true for the reaper's acks of pending entries whose bodies
	// were gone (After and Before are then the lowest and highest acked id,
	// both included).
	Gone bool
}

// CountText is Count for people: "unknown" when Redis cannot tell.
func (l StreamLoss) CountText() string {
	if l.Count < 0 {
		return "unknown"
	}
	return strconv.FormatInt(l.Count, 10)
}

// StreamEntriesLost reports entries a group will never read.
func StreamEntriesLost(l StreamLoss) Alert {
	a := Alert{
		Kind: KindStreamEntriesLost,
		Fields: []Field{
			{Label: "Stream", Value: l.Stream},
			{Label: "Group", Value: l.Group},
			{Label: "Entries", Value: l.CountText()},
		},
		Fingerprint: fmt.Sprintf("stream_entries_lost:%t:%s:%s:%s:%s", l.Gone, l.Stream, l.Group, l.After, l.Before),
	}
	if l.Gone {
		a.Title = fmt.Sprintf("%s pending entries of %s had no body: acked unbilled", l.CountText(), l.Stream)
		a.Text = fmt.Sprintf("The reaper acked pending entries of group %s whose bodies are gone from the stream, ids %s to %s: "+
			"they were trimmed or deleted while pending, and nobody can bill them now. "+
			"Find who trims the stream (a producer's `MAXLEN`, an `XTRIM` or `XDEL` job) and stop it; pelguard-reaper trims safely. "+
			"Re-publish the lost events from their source if it still has them: a re-published event already billed is harmless.",
			code(l.Group), code(l.After), code(l.Before))
		a.Fields = append(a.Fields, Field{Label: "Ids", Value: l.After + " … " + l.Before})
		return a
	}
	a.Title = fmt.Sprintf("%s entries of %s were removed before group %s read them", l.CountText(), l.Stream, l.Group)
	a.Text = fmt.Sprintf("Entries above %s and below %s left the stream unread by group %s: "+
		"someone trimmed or deleted them (a producer's `MAXLEN`, an `XTRIM` or `XDEL` job), and they will never be billed by it. "+
		"Stop that trimming (pelguard-reaper trims safely, see --stream-retention) and re-publish the lost events from their source: "+
		"a re-published event already billed is harmless.",
		code(l.After), code(l.Before), code(l.Group))
	a.Fields = append(a.Fields, Field{Label: "Ids", Value: "above " + l.After + ", below " + l.Before})
	if l.Pending > 0 {
		a.Fields = append(a.Fields, Field{Label: "Pending below the first entry", Value: strconv.FormatInt(l.Pending, 10)})
	}
	return a
}

// DeadLettersWaiting reports a dead-letter stream past its size or age
// threshold. Dead letters are never trimmed: each is an event a person
// must replay or discard.
func DeadLettersWaiting(stream, deadStream string, n int64, oldest time.Duration, maxN int64, maxAge time.Duration) Alert {
	return Alert{
		Kind:  KindDeadLettersWaiting,
		Title: fmt.Sprintf("%d dead letters wait in %s, the oldest for %s", n, deadStream, oldest.Round(time.Minute)),
		Text: fmt.Sprintf("Dead letters are events pelguard did not bill; they stay until a person replays or discards them. "+
			"See them on the console's dead-letter page, or list them with `pelguard-consumer replay --stream %s --dry-run`; "+
			"replay a reason once its cause is fixed with `pelguard-consumer replay --stream %s --reason REASON`.",
			Escape(stream), Escape(stream)),
		Fields: []Field{
			{Label: "Entries", Value: strconv.FormatInt(n, 10)},
			{Label: "Oldest", Value: oldest.Round(time.Minute).String()},
			{Label: "Thresholds", Value: fmt.Sprintf("%d entries or %s", maxN, maxAge)},
		},
		Fingerprint: "dead_letters_waiting:" + stream,
	}
}
