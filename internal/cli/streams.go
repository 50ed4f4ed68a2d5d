package cli

import (
	"flag"
	"strings"
)

// Streams is a repeatable --stream flag. Each value is "name" (read by the
// --group consumer group) or "name=group"; a value may list several,
// comma-separated, as $PELGUARD_STREAM does.
type Streams []string

func (s *Streams) String() string { return strings.Join(*s, ",") }

func (s *Streams) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*s = append(*s, part)
		}
	}
	return nil
}

// RegisterStreams adds --stream and --group to fs; verb says what the
// program does with a stream ("consume", "reap").
func RegisterStreams(fs *flag.FlagSet, s *Streams, group *string, verb string) {
	fs.Var(s, "stream", "stream to "+verb+", repeatable: name (with --group) or name=group;\n"+
		"default $PELGUARD_STREAM or billing-stream [PELGUARD_STREAM, comma-separated]")
	fs.StringVar(group, "group", Env("PELGUARD_GROUP", "billing-group"), "consumer group of streams given without one [PELGUARD_GROUP]")
}

// StreamGroup is a stream and the consumer group that reads it.
type StreamGroup struct{ Stream, Group string }

func (sg StreamGroup) String() string { return sg.Stream + "=" + sg.Group }

// Resolve returns the streams given, or $PELGUARD_STREAM (else
// billing-stream) when none was, each with its group. A malformed value, a
// stream and group named twice, or no stream at all is a usage error.
func (s Streams) Resolve(group string) ([]StreamGroup, error) {
	if len(s) == 0 {
		_ = s.Set(Env("PELGUARD_STREAM", "billing-stream"))
	}
	var out []StreamGroup
	seen := map[string]bool{}
	for _, v := range s {
		name, g, ok := strings.Cut(v, "=")
		if !ok {
			g = group
		}
		if name == "" || g == "" {
			return nil, Usagef("--stream %q: want name or name=group", v)
		}
		sg := StreamGroup{Stream: name, Group: g}
		if seen[sg.String()] {
			return nil, Usagef("--stream %s is given twice", sg)
		}
		seen[sg.String()] = true
		out = append(out, sg)
	}
	if len(out) == 0 {
		return nil, Usagef("no stream given: set --stream or PELGUARD_STREAM")
	}
	return out, nil
}
