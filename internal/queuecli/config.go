package queuecli

import (
	"fmt"
	"regexp"

	"github.com/pgrelay/pgrelay/internal/configfile"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// fromConfig reads the connection (url, cluster_urls, username, password, prefix) and queue of the
// first redis_queue input or output in a pipeline config file, with ${ENV} references resolved.
func fromConfig(path string) (redisconn.Config, string, error) {
	doc, err := configfile.Load(path)
	if err != nil {
		return redisconn.Config{}, "", err
	}
	section := findRedisQueue(doc)
	if section == nil {
		return redisconn.Config{}, "", fmt.Errorf("%s: no redis_queue input or output", path)
	}
	str := func(k, def string) string {
		if v, ok := section[k].(string); ok && v != "" {
			return v
		}
		return def
	}
	c := redisconn.Config{URL: str("url", "redis://127.0.0.1:6379"), Username: str("username", ""),
		Password: str("password", ""), Prefix: str("prefix", "pgrelay")}
	if urls, ok := section["cluster_urls"].([]any); ok {
		for _, u := range urls {
			if s, ok := u.(string); ok {
				c.ClusterURLs = append(c.ClusterURLs, s)
			}
		}
	}
	q := str("queue", "")
	if configfile.HasEnvRef(q) || regexp.MustCompile(`\$\{!`).MatchString(q) {
		q = "" // interpolated: not a queue name
	}
	return c, q, c.Validate()
}

// findRedisQueue returns the first mapping under a redis_queue key, depth first.
func findRedisQueue(v any) map[string]any {
	switch t := v.(type) {
	case map[string]any:
		for _, k := range []string{"input", "output"} { // inputs and outputs first, in that order
			if child, ok := t[k]; ok {
				if m := findRedisQueue(child); m != nil {
					return m
				}
			}
		}
		if m, ok := t["redis_queue"].(map[string]any); ok {
			return m
		}
		for _, child := range t {
			if m := findRedisQueue(child); m != nil {
				return m
			}
		}
	case []any:
		for _, child := range t {
			if m := findRedisQueue(child); m != nil {
				return m
			}
		}
	}
	return nil
}
