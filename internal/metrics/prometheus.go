// Package metrics provides the `prometheus` metrics exporter: Benthos' metrics (and pgrelay's own)
// served in the Prometheus text format on the Benthos HTTP server's /metrics endpoint.
package metrics

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redpanda-data/benthos/v4/public/service"
)

// PrometheusConfig is the parsed configuration of the exporter.
type PrometheusConfig struct {
	Prefix             string    // prepended to every metric name, e.g. "pgrelay"
	UseHistogramTiming bool      // timers as histograms (seconds) instead of summaries
	HistogramBuckets   []float64 // bucket upper bounds in seconds; empty means Prometheus' defaults
	AddProcessMetrics  bool      // process_* metrics (CPU, RSS, fds)
	AddGoMetrics       bool      // go_* runtime metrics
}

// Prometheus is a Benthos metrics exporter backed by its own Prometheus registry (no global
// state), so two streams in one process never collide.
type Prometheus struct {
	conf PrometheusConfig
	reg  *prometheus.Registry
	log  *service.Logger

	mu   sync.Mutex
	vecs map[string]registered
}

type registered struct {
	labels    string
	collector prometheus.Collector
}

// NewPrometheus creates an exporter with a fresh registry.
func NewPrometheus(conf PrometheusConfig, log *service.Logger) *Prometheus {
	p := &Prometheus{conf: conf, reg: prometheus.NewRegistry(), log: log, vecs: map[string]registered{}}
	if conf.AddProcessMetrics {
		p.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if conf.AddGoMetrics {
		p.reg.MustRegister(collectors.NewGoCollector())
	}
	return p
}

var invalidChars = regexp.MustCompile(`[^a-zA-Z0-9_:]`)

// metricName turns a Benthos metric path into a valid Prometheus name with the configured prefix.
func (p *Prometheus) metricName(name string) string {
	if p.conf.Prefix != "" {
		name = p.conf.Prefix + "_" + name
	}
	name = invalidChars.ReplaceAllString(name, "_")
	if name != "" && name[0] >= '0' && name[0] <= '9' {
		name = "_" + name
	}
	return name
}

func sanitizeLabels(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = invalidChars.ReplaceAllString(k, "_")
	}
	return out
}

// vec returns the collector registered under name, creating it with mk the first time. Benthos asks
// for the same metric once per component, so collectors are shared by name; a second request with
// different label keys cannot be served by Prometheus and gets nil (the caller drops its values).
func (p *Prometheus) vec(name string, labels []string, mk func() prometheus.Collector) prometheus.Collector {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := strings.Join(labels, ",")
	if r, ok := p.vecs[name]; ok {
		if r.labels != key {
			p.log.Warnf("metric %s requested with labels [%s], already registered with [%s]; dropping these values", name, key, r.labels)
			return nil
		}
		return r.collector
	}
	c := mk()
	if err := p.reg.Register(c); err != nil {
		p.log.Warnf("metric %s: %v", name, err)
		return nil
	}
	p.vecs[name] = registered{labels: key, collector: c}
	return c
}

// NewCounterCtor implements service.MetricsExporter.
func (p *Prometheus) NewCounterCtor(path string, labelKeys ...string) service.MetricsExporterCounterCtor {
	name, labels := p.metricName(path), sanitizeLabels(labelKeys)
	c := p.vec(name, labels, func() prometheus.Collector {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: "Benthos counter " + path}, labels)
	})
	return func(values ...string) service.MetricsExporterCounter {
		if cv, ok := c.(*prometheus.CounterVec); ok {
			return counter{cv.WithLabelValues(values...)}
		}
		return nop{}
	}
}

// NewGaugeCtor implements service.MetricsExporter.
func (p *Prometheus) NewGaugeCtor(path string, labelKeys ...string) service.MetricsExporterGaugeCtor {
	name, labels := p.metricName(path), sanitizeLabels(labelKeys)
	c := p.vec(name, labels, func() prometheus.Collector {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "Benthos gauge " + path}, labels)
	})
	return func(values ...string) service.MetricsExporterGauge {
		if gv, ok := c.(*prometheus.GaugeVec); ok {
			return gauge{gv.WithLabelValues(values...)}
		}
		return nop{}
	}
}

// NewTimerCtor implements service.MetricsExporter. Benthos times in nanoseconds; Prometheus
// convention is seconds, so observations are converted and the name keeps Benthos' own.
func (p *Prometheus) NewTimerCtor(path string, labelKeys ...string) service.MetricsExporterTimerCtor {
	name, labels := p.metricName(path), sanitizeLabels(labelKeys)
	help := "Benthos timer " + path + " (seconds)"
	c := p.vec(name, labels, func() prometheus.Collector {
		if p.conf.UseHistogramTiming {
			return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: p.conf.HistogramBuckets}, labels)
		}
		return prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: name, Help: help,
			Objectives: map[float64]float64{0.5: 0.05, 0.9: 0.01, 0.99: 0.001}}, labels)
	})
	return func(values ...string) service.MetricsExporterTimer {
		switch v := c.(type) {
		case *prometheus.HistogramVec:
			return timer{v.WithLabelValues(values...)}
		case *prometheus.SummaryVec:
			return timer{v.WithLabelValues(values...)}
		}
		return nop{}
	}
}

// HandlerFunc serves the registry in the Prometheus text format; Benthos mounts it on /metrics.
func (p *Prometheus) HandlerFunc() http.HandlerFunc {
	return promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP
}

// Registry exposes the registry, for tests and for pgrelay's own collectors.
func (p *Prometheus) Registry() *prometheus.Registry { return p.reg }

// Close implements service.MetricsExporter.
func (p *Prometheus) Close(context.Context) error { return nil }

type counter struct{ c prometheus.Counter }

func (c counter) Incr(n int64) { c.c.Add(float64(n)) }

type gauge struct{ g prometheus.Gauge }

func (g gauge) Set(v int64) { g.g.Set(float64(v)) }

type timer struct{ o prometheus.Observer }

func (t timer) Timing(ns int64) { t.o.Observe(float64(ns) / 1e9) }

type nop struct{}

func (nop) Incr(int64)   {}
func (nop) Set(int64)    {}
func (nop) Timing(int64) {}

// validateBuckets checks histogram buckets are strictly increasing.
func validateBuckets(b []float64) error {
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			return fmt.Errorf("metrics.prometheus.histogram_buckets must be strictly increasing: %v", b)
		}
	}
	return nil
}
