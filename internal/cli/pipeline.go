package cli

import (
	"fmt"
	"net"
	"os"
	"regexp"

	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"

	"github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/source"
	"github.com/pgrelay/pgrelay/output"
)

// pipeline is what pgrelay's subcommands read from a pipeline config: every pg_cdc input, pg_sink
// output and redis_queue input and output, each parsed and validated by its own plugin's spec and
// parser, in the order the file lists them, and the pipeline's Prometheus endpoint.
type pipeline struct {
	path         string
	sources      []source.Config
	sinks        []output.PgSinkConfig
	queueInputs  []input.RedisQueueConfig
	queueOutputs []output.RedisQueueConfig
	metricsURL   string // "" when the pipeline serves no Prometheus metrics
}

// Section kinds: where a component sits in the config.
const (
	kindInput  = "input"
	kindOutput = "output"
)

// kindOf is the kind of the components under a key: inputs under input, inputs and
// input_resources (and inside brokers and sequences there); outputs likewise.
var kindOf = map[string]string{
	"input": kindInput, "inputs": kindInput, "input_resources": kindInput,
	"output": kindOutput, "outputs": kindOutput, "output_resources": kindOutput,
}

// readPipeline reads the pipeline config at path, environment references resolved as Benthos
// resolves them, and walks it once.
func readPipeline(path string) (*pipeline, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(resolveEnv(string(raw))), &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &pipeline{path: path}
	if err := p.walk(&doc, ""); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var top map[string]any
	_ = doc.Decode(&top) // a document that is not a mapping has no metrics section
	p.metricsURL = metricsURL(top)
	return p, nil
}

// walk visits n depth first in document order; kind is the kind of the components found there.
func (p *pipeline) walk(n *yaml.Node, kind string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			if err := p.walk(c, kind); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			if value.Kind == yaml.MappingNode {
				if took, err := p.take(key.Value, kind, value); took || err != nil {
					if err != nil {
						return fmt.Errorf("line %d: %s: %w", key.Line, key.Value, err)
					}
					continue
				}
			}
			sub := kind
			if k, ok := kindOf[key.Value]; ok {
				sub = k
			}
			if err := p.walk(value, sub); err != nil {
				return err
			}
		}
	}
	return nil
}

// take parses section when plugin is one of pgrelay's, with that plugin's spec and parser. A
// redis_queue outside any input or output (a resource file, say) is an input when it names a group.
func (p *pipeline) take(plugin, kind string, section *yaml.Node) (bool, error) {
	if plugin == "redis_queue" && kind == "" {
		kind = kindOutput
		for i := 0; i+1 < len(section.Content); i += 2 {
			if section.Content[i].Value == "group" {
				kind = kindInput
			}
		}
	}
	var err error
	switch {
	case plugin == "pg_cdc":
		p.sources, err = parseInto(p.sources, section, input.PgCDCSpec(), input.PgCDCConfigFromParsed)
	case plugin == "pg_sink":
		p.sinks, err = parseInto(p.sinks, section, output.PgSinkSpec(), output.PgSinkConfigFromParsed)
	case plugin == "redis_queue" && kind == kindInput:
		p.queueInputs, err = parseInto(p.queueInputs, section, input.RedisQueueSpec(), input.RedisQueueConfigFromParsed)
	case plugin == "redis_queue":
		p.queueOutputs, err = parseInto(p.queueOutputs, section, output.RedisQueueSpec(), output.RedisQueueConfigFromParsed)
	default:
		return false, nil
	}
	return true, err
}

// parseInto parses section with spec and the plugin's parser and appends the result to list.
func parseInto[T any](list []T, section *yaml.Node, spec *service.ConfigSpec, fromParsed func(*service.ParsedConfig) (T, error)) ([]T, error) {
	b, err := yaml.Marshal(section)
	if err != nil {
		return list, err
	}
	pc, err := spec.ParseYAML(string(b), nil)
	if err != nil {
		return list, err
	}
	c, err := fromParsed(pc)
	if err != nil {
		return list, err
	}
	return append(list, c), nil
}

// envRef is a Benthos environment reference: ${NAME} or ${NAME:default}.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}`)

// resolveEnv replaces every ${NAME} and ${NAME:default} in text: the variable's value, or the
// default when it is unset or empty (as Benthos does). Interpolations (${! ... }) stay.
func resolveEnv(text string) string {
	return envRef.ReplaceAllStringFunc(text, func(ref string) string {
		m := envRef.FindStringSubmatch(ref)
		if v := os.Getenv(m[1]); v != "" {
			return v
		}
		return m[2]
	})
}

// MetricsURLEnv overrides the metrics endpoint status scrapes (e.g. for `pgrelay streams`, whose
// http and metrics sections live in another file than the pipeline's).
const MetricsURLEnv = "PGRELAY_METRICS_URL"

// metricsURL is the Prometheus endpoint of a pipeline config: its http server (default
// 0.0.0.0:4195, asked on 127.0.0.1) when the config has a prometheus metrics exporter; "" otherwise.
func metricsURL(doc map[string]any) string {
	if u := os.Getenv(MetricsURLEnv); u != "" {
		return u
	}
	metrics, _ := doc["metrics"].(map[string]any)
	if _, ok := metrics["prometheus"]; !ok {
		return ""
	}
	httpSection, _ := doc["http"].(map[string]any)
	if enabled, ok := httpSection["enabled"].(bool); ok && !enabled {
		return ""
	}
	addr, _ := httpSection["address"].(string)
	if addr == "" {
		addr = "0.0.0.0:4195"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}
