package cdctest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// TestStopStreamBeforeRun: a stop that comes before Run has built the stream still stops it
// once Run does (Benthos alone refuses it and the stream runs on, so a test waiting for Run to
// return would hang), and one that finds the stream running stops it at once.
func TestStopStreamBeforeRun(t *testing.T) {
	for _, tc := range []struct {
		name     string
		runAfter time.Duration // Run starts this long after the stop was asked
	}{
		{name: "stop before run", runAfter: 100 * time.Millisecond},
		{name: "stop while running", runAfter: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := generateStream(t)
			ran := make(chan error, 1)
			run := func() { ran <- s.Run(context.Background()) }
			stopped := make(chan error, 1)
			if tc.runAfter < 0 {
				go run()
				time.Sleep(100 * time.Millisecond)
				go func() { stopped <- StopStream(s, 5*time.Second) }()
			} else {
				go func() { stopped <- StopStream(s, 5*time.Second) }()
				time.Sleep(tc.runAfter)
				go run()
			}
			if err := <-stopped; err != nil {
				t.Fatalf("stop: %v", err)
			}
			select {
			case <-ran:
			case <-time.After(5 * time.Second):
				t.Fatal("the stream still runs after StopStream returned")
			}
		})
	}
}

// generateStream builds a stream of a generate input into the drop output, not yet run.
func generateStream(t *testing.T) *service.Stream {
	t.Helper()
	b := service.NewStreamBuilder()
	if err := b.SetYAML("input:\n  generate:\n    mapping: 'root = \"x\"'\n    interval: 10ms\noutput:\n  drop: {}\nlogger:\n  level: none\n"); err != nil {
		t.Fatal(err)
	}
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StopAndWait returns once Run returned, and reports a Run that did not return in time instead of
// waiting for it forever.
func TestStopAndWaitReportsARunThatDoesNotReturn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		closeIt bool // the done channel the test passes is closed when Run returns
		want    string
	}{
		{name: "returns", closeIt: true},
		{name: "never returns", closeIt: false, want: "did not return"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := generateStream(t)
			ran, never := make(chan struct{}), make(chan struct{})
			go func() { _ = s.Run(context.Background()); close(ran) }()
			done := never
			if tc.closeIt {
				done = ran
			}
			rec := &fakeTB{TB: t}
			StopAndWait(rec, s, done, time.Second)
			switch {
			case tc.want == "" && len(rec.errors) > 0:
				t.Fatalf("errors: %q", rec.errors)
			case tc.want != "" && (len(rec.errors) != 1 || !strings.Contains(rec.errors[0], tc.want)):
				t.Fatalf("errors %q, want one with %q", rec.errors, tc.want)
			}
		})
	}
}
