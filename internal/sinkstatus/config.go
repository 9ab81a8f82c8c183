// Package sinkstatus is the sink half of `pgrelay status -c <config>`: for every pg_sink output of a
// pipeline config it reads the sink's progress rows (the offset applied per queue shard), and for
// every redis_queue input the consumer group's lag, pending entries, owners and dead letters, and
// prints them human-readable or as JSON. The status command itself lives with the source
// (internal/source/cli.go) and hands the config to WithSinks.
package sinkstatus

import (
	"fmt"
	"sort"

	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"

	"github.com/pgrelay/pgrelay/internal/configfile"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
	"github.com/pgrelay/pgrelay/internal/sink"
)

// SinkRef is what a pg_sink output of the config says: where its progress rows are.
type SinkRef struct {
	Name          string
	Table         string
	Mode          string
	ProgressTable string
	Conn          pgconnect.Config
}

// GroupRef is what a redis_queue input of the config says: which group reads which queue where.
type GroupRef struct {
	Queue string
	Group string
	Redis redisconn.Config
}

// Parts are the sink-side components found in one pipeline config.
type Parts struct {
	Sinks      []SinkRef
	Groups     []GroupRef
	HasSource  bool   // the config also holds a pg_cdc input (shown by the source's status)
	MetricsURL string // the pipeline's Prometheus endpoint, "" when it has none
}

// PartsFromFile reads a pipeline config (env references resolved as Benthos does) and returns its
// pg_sink outputs and redis_queue inputs (a redis_queue with a `group` is an input).
func PartsFromFile(path string) (Parts, error) {
	doc, err := configfile.Load(path)
	if err != nil {
		return Parts{}, err
	}
	var p Parts
	if err := p.walk(doc); err != nil {
		return Parts{}, fmt.Errorf("%s: %w", path, err)
	}
	if top, ok := doc.(map[string]any); ok {
		p.MetricsURL = metricsURL(top)
	} else {
		p.MetricsURL = metricsURL(nil)
	}
	return p, nil
}

// walk visits the document depth first, keys in sorted order (outputs inside brokers and switches
// are found too).
func (p *Parts) walk(v any) error {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			section, isMap := v[k].(map[string]any)
			switch {
			case k == "pg_cdc":
				p.HasSource = true
				continue
			case k == "pg_sink" && isMap:
				s, err := sinkRef(section)
				if err != nil {
					return fmt.Errorf("pg_sink: %w", err)
				}
				p.Sinks = append(p.Sinks, s)
				continue
			case k == "redis_queue" && isMap && section["group"] != nil:
				g, err := groupRef(section)
				if err != nil {
					return fmt.Errorf("redis_queue: %w", err)
				}
				p.Groups = append(p.Groups, g)
				continue
			}
			if err := p.walk(v[k]); err != nil {
				return err
			}
		}
	case []any:
		for _, x := range v {
			if err := p.walk(x); err != nil {
				return err
			}
		}
	}
	return nil
}

// sinkSpec parses the fields of a pg_sink section that status needs, with the output's connection
// fields and defaults (pgconnect); the output's other fields are ignored.
func sinkSpec() *service.ConfigSpec {
	return service.NewConfigSpec().Fields(pgconnect.Fields()...).
		Field(service.NewStringField("name")).
		Field(service.NewStringField("table").Default("")).
		Field(service.NewStringField("mode").Default("")).
		Field(service.NewStringField("progress_table").Default(sink.DefaultProgressTable))
}

// sinkRef reads the connection and identity fields of a pg_sink section.
func sinkRef(m map[string]any) (SinkRef, error) {
	pc, err := parseSection(sinkSpec(), m, "dsn", "host", "port", "user", "password", "database", "tls",
		"name", "table", "mode", "progress_table")
	if err != nil {
		return SinkRef{}, err
	}
	var s SinkRef
	if s.Conn, err = pgconnect.Parse(pc); err != nil {
		return s, err
	}
	if err := s.Conn.Validate(); err != nil {
		return s, err
	}
	s.Conn.ApplicationName = "pgrelay-status"
	for dst, field := range map[*string]string{&s.Name: "name", &s.Table: "table", &s.Mode: "mode", &s.ProgressTable: "progress_table"} {
		if *dst, err = pc.FieldString(field); err != nil {
			return s, err
		}
	}
	if s.Name == "" {
		return s, fmt.Errorf("name is empty")
	}
	return s, nil
}

// parseSection parses the named fields of a config section with spec (unknown fields are dropped
// first, so the component's other fields do not matter).
func parseSection(spec *service.ConfigSpec, m map[string]any, fields ...string) (*service.ParsedConfig, error) {
	kept := map[string]any{}
	for _, f := range fields {
		if v, ok := m[f]; ok {
			kept[f] = v
		}
	}
	b, err := yaml.Marshal(kept)
	if err != nil {
		return nil, err
	}
	return spec.ParseYAML(string(b), nil)
}

// groupSpec parses the connection fields of a redis_queue input exactly as the input does
// (redisconn's fields and defaults, TLS included); the input's other fields are ignored.
func groupSpec() *service.ConfigSpec {
	return service.NewConfigSpec().Fields(redisconn.Fields()...).
		Field(service.NewStringField("queue")).
		Field(service.NewStringField("group"))
}

func groupRef(m map[string]any) (GroupRef, error) {
	pc, err := parseSection(groupSpec(), m, "url", "cluster_urls", "username", "password", "tls", "prefix", "queue", "group")
	if err != nil {
		return GroupRef{}, err
	}
	g := GroupRef{}
	if g.Redis, err = redisconn.Parse(pc); err != nil {
		return g, err
	}
	if g.Queue, err = pc.FieldString("queue"); err != nil {
		return g, err
	}
	if g.Group, err = pc.FieldString("group"); err != nil {
		return g, err
	}
	if g.Redis.Prefix == "" {
		g.Redis.Prefix = queue.DefaultPrefix
	}
	return g, nil
}
