package cdctest

import (
	"fmt"
	"strings"
)

// Pipeline is the config of a pg_cdc → redis_queue pipeline as the tests run it, through the
// stream builder or the built binary.
type Pipeline struct {
	Name   string // the source's name
	DSN    string
	Tables string // the tables list, flow-style YAML: [{table: w, queue: q}]
	// Redis is the URL of the one Redis both the source's keys and the queue live on; ClusterURLs,
	// when set, are the seed nodes of a Redis Cluster used instead.
	Redis       string
	ClusterURLs []string
	Source      string // further pg_cdc fields, YAML lines at the left margin
	Durability  string // redis_queue durability; empty: the output's default
	Output      string // further redis_queue fields, YAML lines at the left margin
	LogLevel    string // empty: warn
	Top         string // further top-level YAML (http:, shutdown_timeout:, metrics:)
}

// YAML renders the config. The source holds its lease for 3 s and beats every second, so a test
// that kills or stops it sees another take over quickly.
func (p Pipeline) YAML() string {
	redisIn, redisOut := "{url: "+p.Redis+"}", "url: "+p.Redis
	if len(p.ClusterURLs) > 0 {
		urls := "[" + strings.Join(p.ClusterURLs, ", ") + "]"
		redisIn, redisOut = "{cluster_urls: "+urls+"}", "cluster_urls: "+urls
	}
	var out strings.Builder
	fmt.Fprintf(&out, `input:
  pg_cdc:
    name: %s
    dsn: %s
    tls: {mode: disable}
    tables: %s
    redis: %s
    lease_ttl: 3s
    heartbeat: 1s
%soutput:
  redis_queue:
    %s
`, p.Name, p.DSN, p.Tables, redisIn, Indent(p.Source, "    "), redisOut)
	if p.Durability != "" {
		fmt.Fprintf(&out, "    durability: %s\n", p.Durability)
	}
	out.WriteString(Indent(p.Output, "    "))
	level := p.LogLevel
	if level == "" {
		level = "warn"
	}
	fmt.Fprintf(&out, "logger:\n  level: %s\n%s", level, Indent(p.Top, ""))
	return out.String()
}

// Indent puts pad before every line of the YAML block s (trimmed of surrounding white space) and
// ends it with a newline; a blank s stays empty.
func Indent(s, pad string) string {
	if strings.TrimSpace(s) == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return pad + strings.Join(lines, "\n"+pad) + "\n"
}
