package input

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracingBase is the context pgrelay's inputs give their messages. Benthos starts a span for every
// message at the input and again at the output. With the stream's tracer the no-op one (`tracer`
// unset or `none`), a message whose context holds no span gets a new context wrapping the no-op span
// at each of those two steps: two allocations per message for nothing. Handed a context that
// already holds a non-recording span whose span context is not the zero value, the no-op tracer
// returns that context as it is. So when the tracer is the no-op one, tracingBase puts such a span
// in ctx: its span context has zero trace and span ids (invalid: `tracing_id()` still gives zeros
// and propagators inject nothing, exactly as with no span) and is marked remote, which is what
// makes it differ from the zero value. With any other tracer ctx is returned unchanged, so real
// spans start as roots as before.
func tracingBase(ctx context.Context, prov trace.TracerProvider) context.Context {
	if _, ok := prov.(noop.TracerProvider); !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, trace.SpanContext{})
}
