package cli

import (
	"errors"
	"slices"
	"testing"
)

func TestStreamsResolve(t *testing.T) {
	var s Streams
	_ = s.Set("a, b=g2")
	_ = s.Set("c")
	got, err := s.Resolve("g")
	if err != nil {
		t.Fatal(err)
	}
	want := []StreamGroup{{Stream: "a", Group: "g"}, {Stream: "b", Group: "g2"}, {Stream: "c", Group: "g"}}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}

	t.Setenv("PELGUARD_STREAM", "x,y=h")
	got, err = Streams(nil).Resolve("g")
	if want := []StreamGroup{{"x", "g"}, {"y", "h"}}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("from $PELGUARD_STREAM: %v %v, want %v", got, err, want)
	}

	if got, err := (Streams{"a=g1", "a=g2"}).Resolve("g"); err != nil || len(got) != 2 {
		t.Fatalf("one stream read by two groups: %v %v", got, err)
	}
	t.Setenv("PELGUARD_STREAM", " , ")
	if _, err := Streams(nil).Resolve("g"); err == nil {
		t.Fatal("PELGUARD_STREAM without a stream name: no error")
	}
	for _, bad := range []Streams{{"a", "a=g"}, {"=g"}, {"a="}} {
		var u *UsageError
		if _, err := bad.Resolve("g"); !errors.As(err, &u) {
			t.Errorf("%v: error %v, want a usage error", bad, err)
		}
	}
}
