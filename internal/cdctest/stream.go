package cdctest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// StreamStopWait is how long a stop of a test's stream waits for it to finish gracefully.
const StreamStopWait = 10 * time.Second

// RunStream builds b and runs the stream in the background. stop stops it (waiting up to
// StreamStopWait) and returns the stream's Stop error; the test's cleanup stops it when the test
// did not.
func RunStream(tb testing.TB, b *service.StreamBuilder) (stop func() error) {
	tb.Helper()
	s, err := b.Build()
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = s.Run(context.Background()) }()
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() { stopErr = StopStream(s, StreamStopWait) })
		return stopErr
	}
	tb.Cleanup(func() { _ = stop() })
	return stop
}

// notRunYet is how Benthos refuses to stop a stream whose Run has not built it yet.
const notRunYet = "has not been run yet"

// StopStream stops s, waiting up to within for it to finish gracefully. A stream started with
// `go s.Run(…)` may not have been built by Run yet when the test stops it (a test whose
// condition already holds stops at once): Benthos then refuses the stop and the stream would
// run on, so StopStream tries again until Run has built it or within has passed.
func StopStream(s *service.Stream, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := s.StopWithin(time.Until(deadline))
		if err == nil || !strings.Contains(err.Error(), notRunYet) || !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// StopAndWait stops s as StopStream does, then waits up to within more for its Run to return
// (done closed): a stream that stops badly or never returns fails the test instead of hanging it.
func StopAndWait(tb testing.TB, s *service.Stream, done <-chan struct{}, within time.Duration) {
	tb.Helper()
	if err := StopStream(s, within); err != nil {
		tb.Errorf("stop: %v", err)
	}
	select {
	case <-done:
	case <-time.After(within):
		tb.Errorf("the stream's Run did not return within %s of its stop", within)
	}
}

// RunConsumer adds consume as b's output and runs the stream as RunStream does.
func RunConsumer(tb testing.TB, b *service.StreamBuilder, consume service.MessageBatchHandlerFunc) (stop func() error) {
	tb.Helper()
	if err := b.AddBatchConsumerFunc(consume); err != nil {
		tb.Fatal(err)
	}
	return RunStream(tb, b)
}
