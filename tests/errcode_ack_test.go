package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/lease"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// probeInput is a batch input plugin, as pg_cdc is: it sends one batch and hands the error its ack
// receives to the test.
type probeInput struct {
	batch service.MessageBatch
	acks  chan error
	sent  bool
}

func (p *probeInput) Connect(context.Context) error { return nil }

func (p *probeInput) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	if p.sent {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	p.sent = true
	return p.batch, func(_ context.Context, err error) error { p.acks <- err; return nil }, nil
}

func (p *probeInput) Close(context.Context) error { return nil }

// TestFencedAckReachesInputAsValue proves that an input plugin's ack receives the redis_queue
// output's fenced error as the coded value, not only its text: errcode.Is matches through wrapping
// alone, and pg_cdc's ack depends on it to end a fenced session.
func TestFencedAckReachesInputAsValue(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	l := lease.New(r.Client(), "pgrelay:{ack}:src:a:lease", 10*time.Second, "src")
	if ok, _ := l.TryAcquire(ctx); !ok {
		t.Fatal("lease")
	}
	probe := &probeInput{acks: make(chan error, 1),
		batch: batchOf(3, 0, map[string]string{"pgrelay_lease_key": "pgrelay:{ack}:src:a:lease",
			"pgrelay_fence": "old|1", "pgrelay_pointer_key": "pgrelay:{ack}:src:a:ptr", "pgrelay_cover": `{"pos":"01"}`})}
	env := service.GlobalEnvironment().Clone()
	if err := env.RegisterBatchInput("errcode_ack_probe", service.NewConfigSpec(),
		func(*service.ParsedConfig, *service.Resources) (service.BatchInput, error) { return probe, nil }); err != nil {
		t.Fatal(err)
	}
	b := env.NewStreamBuilder()
	b.SetLoggerYAML("level: none")
	if err := b.AddInputYAML("errcode_ack_probe: {}"); err != nil {
		t.Fatal(err)
	}
	if err := b.AddOutputYAML(fmt.Sprintf("redis_queue:\n  url: %s\n  queue: ack\n  partition: ${! meta(\"p\") }\n  id: ${! meta(\"id\") }\n", r.URL())); err != nil {
		t.Fatal(err)
	}
	cdctest.RunStream(t, b)
	select {
	case err := <-probe.acks:
		if !errcode.Is(err, errcode.Fenced) || errcode.Of(err) != errcode.Fenced {
			t.Fatalf("ack error %v (%T) does not carry the fenced code as a value", err, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no ack")
	}
	if n := r.Client().Exists(ctx, "pgrelay:{ack}:src:a:ptr").Val(); n != 0 {
		t.Fatal("a fenced batch moved the pointer")
	}
}
