package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// TestPrometheusServesBenthosCounters runs a stream with the exporter and scrapes /metrics.
func TestPrometheusServesBenthosCounters(t *testing.T) {
	mux := http.NewServeMux()
	b := service.NewStreamBuilder()
	b.SetHTTPMux(mux)
	if err := b.SetYAML(`
input:
  label: gen
  generate:
    mapping: 'root = {"n": counter()}'
    interval: ""
    count: 25
output:
  label: sink
  drop: {}
metrics:
  prometheus:
    prefix: pgrelay
logger:
  level: warn
`); err != nil {
		t.Fatal(err)
	}
	s, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.StopWithin(5 * time.Second)

	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		"# TYPE pgrelay_input_received counter",
		`pgrelay_input_received{label="gen",path="root.input"} 25`,
		`pgrelay_output_sent{label="sink",path="root.output"} 25`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
}

func TestMetricName(t *testing.T) {
	cases := []struct{ prefix, in, want string }{
		{"", "input_received", "input_received"},
		{"pgrelay", "input_received", "pgrelay_input_received"},
		{"", "odd.name-x", "odd_name_x"},
		{"", "9lives", "_9lives"},
	}
	for _, c := range cases {
		p := NewPrometheus(PrometheusConfig{Prefix: c.prefix}, nil)
		if got := p.metricName(c.in); got != c.want {
			t.Errorf("metricName(%q,%q) = %q, want %q", c.prefix, c.in, got, c.want)
		}
	}
}

func TestSameNameDifferentLabelsIsDropped(t *testing.T) {
	p := NewPrometheus(PrometheusConfig{}, nil)
	p.NewCounterCtor("x", "a")("1").Incr(2)
	p.NewCounterCtor("x", "a", "b")("1", "2").Incr(5) // dropped, no panic
	p.NewCounterCtor("x", "a")("1").Incr(3)
	mfs, err := p.Registry().Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetMetric()[0].GetCounter().GetValue() != 5 {
		t.Fatalf("gather: %v %v", mfs, err)
	}
}

func TestBucketsMustIncrease(t *testing.T) {
	if validateBuckets([]float64{0.1, 0.1}) == nil || validateBuckets([]float64{0.1, 1}) != nil {
		t.Fatal("bucket validation wrong")
	}
}
