package metrics

import (
	"github.com/redpanda-data/benthos/v4/public/service"
)

func prometheusSpec() *service.ConfigSpec {
	return service.NewConfigSpec().
		Stable().
		Version("0.1.0").
		Summary("Serves metrics in the Prometheus text format on the HTTP server's `/metrics` endpoint.").
		Description("Every Benthos metric (input_received, output_sent, ...) and pgrelay's own keep their "+
			"labels (`label`, `path`, ...). Timers are reported in seconds. Bind the HTTP server to "+
			"loopback (`http: {address: 127.0.0.1:4195}`) unless something else must scrape it.").
		Fields(
			service.NewStringField("prefix").Description("Prefix for every metric name, joined with `_`.").Default("").
				LintRule(`root = if this != "" && !this.re_match("^[a-zA-Z_][a-zA-Z0-9_]*$") { ["prefix must match [a-zA-Z_][a-zA-Z0-9_]*"] }`),
			service.NewBoolField("use_histogram_timing").Description("Report timers as histograms instead of summaries.").Default(false).Advanced(),
			service.NewFloatListField("histogram_buckets").Description("Histogram bucket upper bounds in seconds; empty uses Prometheus' defaults.").Default([]any{}).Advanced(),
			service.NewBoolField("add_process_metrics").Description("Add process_* metrics (CPU, memory, file descriptors).").Default(false),
			service.NewBoolField("add_go_metrics").Description("Add go_* runtime metrics.").Default(false),
		).
		Example("Loopback scrape endpoint", "Serves `/metrics` on 127.0.0.1:4195 only, with the process' CPU, memory and file-descriptor metrics added.", `
http:
  address: 127.0.0.1:4195
metrics:
  prometheus:
    add_process_metrics: true
`)
}

func init() {
	service.MustRegisterMetricsExporter("prometheus", prometheusSpec(),
		func(conf *service.ParsedConfig, log *service.Logger) (service.MetricsExporter, error) {
			c, err := parsePrometheus(conf)
			if err != nil {
				return nil, err
			}
			return NewPrometheus(c, log), nil
		})
}

func parsePrometheus(conf *service.ParsedConfig) (PrometheusConfig, error) {
	var c PrometheusConfig
	var err error
	if c.Prefix, err = conf.FieldString("prefix"); err != nil {
		return c, err
	}
	if c.UseHistogramTiming, err = conf.FieldBool("use_histogram_timing"); err != nil {
		return c, err
	}
	if c.HistogramBuckets, err = conf.FieldFloatList("histogram_buckets"); err != nil {
		return c, err
	}
	if err = validateBuckets(c.HistogramBuckets); err != nil {
		return c, err
	}
	if c.AddProcessMetrics, err = conf.FieldBool("add_process_metrics"); err != nil {
		return c, err
	}
	c.AddGoMetrics, err = conf.FieldBool("add_go_metrics")
	return c, err
}
