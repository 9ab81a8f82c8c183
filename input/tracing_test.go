package input

import (
	"context"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
	"github.com/redpanda-data/benthos/v4/public/service"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgrelay/pgrelay/internal/queue"
)

// otherTracer stands for any tracer but the no-op one (a configured exporter).
type otherTracer struct{ noop.TracerProvider }

// TestTracingBase: with the no-op tracer, the span Benthos starts for a message at its input and
// again at its output reuses the message's context (no new context per message and step), and
// nothing a pipeline can see changes: tracing_id() gives zeros and a propagator injects nothing,
// as for a message with no span. With another tracer the context is left as it is.
func TestTracingBase(t *testing.T) {
	bg := context.Background()
	tracer := noop.NewTracerProvider().Tracer("benthos")
	base := tracingBase(bg, noop.NewTracerProvider())
	if base == bg {
		t.Fatal("no-op tracer: tracingBase returned its context unchanged")
	}
	for _, ctx := range []context.Context{base, context.WithValue(base, struct{}{}, 1)} { // as is, and under a batch's value
		got, span := tracer.Start(ctx, "input")
		if got != ctx {
			t.Error("the no-op tracer's Start made a new context for a message whose context comes from tracingBase")
		}
		if span.IsRecording() || span.SpanContext().IsValid() {
			t.Errorf("span %+v: want non-recording, invalid", span.SpanContext())
		}
	}
	if got, _ := tracer.Start(bg, "input"); got == bg {
		t.Fatal("the no-op tracer reuses a context without a span: this test no longer tells the cases apart")
	}

	exe, err := bloblang.Parse(`root = tracing_id()`)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for name, m := range map[string]*service.Message{"plain": service.NewMessage(nil), "base": service.NewMessage(nil).WithContext(base)} {
		res, err := m.BloblangQuery(exe)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := res.AsBytes()
		ids[name] = string(b)
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(m.Context(), carrier)
		if len(carrier) != 0 {
			t.Errorf("%s message: propagator injected %v", name, carrier)
		}
	}
	if ids["base"] != ids["plain"] {
		t.Errorf("tracing_id() %q with the base context, %q without", ids["base"], ids["plain"])
	}

	if got := tracingBase(bg, otherTracer{}); got != bg || trace.SpanContextFromContext(got).IsRemote() {
		t.Error("another tracer: tracingBase changed the context")
	}
}

// TestInputMessagesReuseTheirContext: the messages both inputs build carry tracingBase's span, so
// the no-op tracer starts their spans without a new context each.
func TestInputMessagesReuseTheirContext(t *testing.T) {
	tracer := noop.NewTracerProvider().Tracer("benthos")
	pc, err := RedisQueueSpec().ParseYAML("queue: q\ngroup: g\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := newQueueInput(pc, service.MockResources())
	if err != nil {
		t.Fatal(err)
	}
	msgs := map[string]*service.Message{
		"redis_queue": in.message(0, &queue.Entry{Payload: []byte(`{}`)}),
		"pg_cdc":      toMessages(tracingBase(context.Background(), noop.NewTracerProvider()), benchBatch(1), true)[0],
	}
	for name, m := range msgs {
		if got, _ := tracer.Start(m.Context(), "input"); got != m.Context() {
			t.Errorf("%s: a message's span needs a new context", name)
		}
	}
}
