package cdctest

import (
	"context"
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
		once.Do(func() { stopErr = s.StopWithin(StreamStopWait) })
		return stopErr
	}
	tb.Cleanup(func() { _ = stop() })
	return stop
}

// RunConsumer adds consume as b's output and runs the stream as RunStream does.
func RunConsumer(tb testing.TB, b *service.StreamBuilder, consume service.MessageBatchHandlerFunc) (stop func() error) {
	tb.Helper()
	if err := b.AddBatchConsumerFunc(consume); err != nil {
		tb.Fatal(err)
	}
	return RunStream(tb, b)
}
