// Package linttest proves a plugin's lint rules refuse every config its start-up validation
// refuses: a table pairs each refused config with the lint message that must refuse it too.
package linttest

import (
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
	"gopkg.in/yaml.v3"
)

// Case is one config of a plugin: Base with Set's top-level fields replaced (a YAML mapping; a
// field set to ~ is removed).
type Case struct {
	Name string
	Set  string
	// Refused is a part of the start's error; "" when the start accepts the config.
	Refused string
	// Lint is a part of a lint message; "" when lint passes the config. Lint must refuse whatever
	// the start refuses; it may refuse more (a value the start corrects to its default).
	Lint string
	// Unlintable, when set, says why lint cannot refuse what the start refuses: the start reads a
	// file the config names (a TLS certificate that does not exist), or the value has the wrong YAML
	// type (text for a number or a bool: Benthos v4.60's linter runs no rule on a value that does
	// not decode to its field's type, and reports nothing). The case still proves the start refuses it.
	Unlintable string
}

// Kind is where the plugin goes: an input or an output.
type Kind int

// Kinds.
const (
	Input Kind = iota
	Output
)

// Check runs each case through the start's parser and validation (start: the plugin's spec,
// ParseYAML and its parser) and through the Benthos linter, and fails when they disagree with the
// case or with each other.
func Check(t *testing.T, kind Kind, plugin, base string, start func(yaml string) error, cases []Case) {
	t.Helper()
	linter := service.GlobalEnvironment().NewComponentConfigLinter()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			section := merge(t, base, c.Set)
			t.Logf("config:\n%s", section)
			err := start(section)
			switch {
			case c.Refused == "" && err != nil:
				t.Fatalf("the start refused it: %v", err)
			case c.Refused != "" && err == nil:
				t.Fatalf("the start accepted it, want an error with %q", c.Refused)
			case c.Refused != "" && !strings.Contains(err.Error(), c.Refused):
				t.Fatalf("the start's error %q lacks %q", err, c.Refused)
			}
			component := []byte(plugin + ":\n  " + strings.ReplaceAll(strings.TrimSuffix(section, "\n"), "\n", "\n  ") + "\n")
			var lints []service.Lint
			if kind == Input {
				lints, err = linter.LintInputYAML(component)
			} else {
				lints, err = linter.LintOutputYAML(component)
			}
			if err != nil {
				t.Fatal(err)
			}
			var msgs []string
			for _, l := range lints {
				msgs = append(msgs, l.What)
			}
			all := strings.Join(msgs, "; ")
			switch {
			case c.Lint == "" && len(msgs) > 0:
				t.Fatalf("lint refused it: %s", all)
			case c.Lint != "" && !strings.Contains(all, c.Lint):
				t.Fatalf("lint said %q, want %q", all, c.Lint)
			case c.Refused != "" && c.Lint == "" && c.Unlintable == "":
				t.Fatalf("the start refuses it (%s) but lint passes it", c.Refused)
			}
		})
	}
}

// Start is the start's reading of a config: spec's ParseYAML, then the plugin's parser and its
// validation.
func Start[T any](spec *service.ConfigSpec, fromParsed func(*service.ParsedConfig) (T, error)) func(yaml string) error {
	return func(yaml string) error {
		pc, err := spec.ParseYAML(yaml, nil)
		if err != nil {
			return err
		}
		_, err = fromParsed(pc)
		return err
	}
}

// merge replaces base's top-level fields with set's.
func merge(t *testing.T, base, set string) string {
	t.Helper()
	var b, s yaml.Node
	if err := yaml.Unmarshal([]byte(base), &b); err != nil {
		t.Fatalf("base: %v", err)
	}
	if err := yaml.Unmarshal([]byte(set), &s); err != nil {
		t.Fatalf("set: %v", err)
	}
	bm, sm := b.Content[0], &yaml.Node{Kind: yaml.MappingNode}
	if len(s.Content) > 0 {
		sm = s.Content[0]
	}
	for i := 0; i+1 < len(sm.Content); i += 2 {
		key, value := sm.Content[i], sm.Content[i+1]
		var kept []*yaml.Node
		for j := 0; j+1 < len(bm.Content); j += 2 {
			if bm.Content[j].Value != key.Value {
				kept = append(kept, bm.Content[j], bm.Content[j+1])
			}
		}
		if value.Tag != "!!null" {
			kept = append(kept, key, value)
		}
		bm.Content = kept
	}
	out, err := yaml.Marshal(bm)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Why a case's refusal has no lint twin (Case.Unlintable).
const (
	TypeError   = "the wrong YAML type: Benthos' linter skips the rules"
	FileMissing = "the start reads the file"
)

// PGConnCases are the refusals of the PostgreSQL connection fields (internal/pgconnect), which
// pg_cdc and pg_sink share; the plugin's base config sets host.
func PGConnCases() []Case {
	return []Case{
		{Name: "no dsn and no host", Set: "host: ~", Refused: "dsn: set dsn or host", Lint: "dsn: set dsn or host"},
		{Name: "dsn URL", Set: "{host: ~, dsn: 'postgres://u@127.0.0.1:5432/db?sslmode=disable'}"},
		{Name: "dsn key=value", Set: "{host: ~, dsn: \"host=127.0.0.1 user=u password='a b' dbname=db\"}"},
		{Name: "dsn URL port", Set: "{host: ~, dsn: 'postgres://127.0.0.1:port/db'}", Refused: "dsn:", Lint: "dsn must be a postgres:// URL or key=value pairs"},
		{Name: "dsn key=value syntax", Set: "{host: ~, dsn: 'host=127.0.0.1 port'}", Refused: "dsn:", Lint: "dsn must be a postgres:// URL or key=value pairs"},
		{Name: "port high", Set: "port: 70000", Refused: "port:", Lint: "port must be between 0 and 65535"},
		{Name: "port negative", Set: "port: -1", Refused: "port:", Lint: "port must be between 0 and 65535"},
		{Name: "port text", Set: "port: high", Refused: "port", Unlintable: TypeError},
		{Name: "tls mode", Set: "tls: {mode: maybe}", Refused: "tls.mode:", Lint: "not a valid option"},
		{Name: "root CA without verification", Set: "tls: {mode: require, root_ca_file: /etc/ca.pem}", Refused: "tls.root_ca_file:", Lint: "tls.root_ca_file: needs tls.mode verify-ca or verify-full"},
		{Name: "root CA with mode prefer", Set: "tls: {mode: prefer, root_ca_file: /etc/ca.pem}", Refused: "tls.root_ca_file:", Lint: "tls.root_ca_file: needs tls.mode"},
		{Name: "certificate without key", Set: "tls: {client_cert_file: /etc/c.pem}", Refused: "tls.client_cert_file:", Lint: "client_cert_file and client_key_file go together"},
		{Name: "a CA file that is not there", Set: "tls: {mode: verify-full, root_ca_file: /nonexistent/ca.pem}", Refused: "dsn:", Unlintable: FileMissing},
	}
}

// RedisConnCases are the refusals of the Redis connection fields (internal/redisconn), which every
// component shares: at the top of the section (under "") or under an object field (pg_cdc's
// "redis"). The plugin's base config writes to the queue orders.
func RedisConnCases(under string) []Case {
	set, path := func(fields string) string { return fields }, ""
	if under != "" {
		set, path = func(fields string) string { return under + ": " + fields }, under+"."
	}
	return []Case{
		{Name: "redis url scheme", Set: set("{url: 'http://127.0.0.1:6379'}"), Refused: "redis url", Lint: path + "url must be redis://"},
		{Name: "redis url database", Set: set("{url: 'redis://127.0.0.1:6379/zero'}"), Refused: "redis url", Lint: path + "url must be redis://"},
		{Name: "redis url port", Set: set("{url: 'redis://127.0.0.1:port'}"), Refused: "redis url", Lint: path + "url must be redis://"},
		{Name: "rediss url", Set: set("{url: 'rediss://127.0.0.1:6380/1'}")},
		{Name: "redis cluster url scheme", Set: set("{cluster_urls: ['http://127.0.0.1:7000']}"), Refused: "redis url", Lint: path + "cluster_urls must list"},
		{Name: "redis cluster url port", Set: set("{cluster_urls: ['redis://127.0.0.1:port']}"), Refused: "redis url", Lint: path + "cluster_urls must list"},
		{Name: "redis cluster url database", Set: set("{cluster_urls: ['redis://127.0.0.1:7000/2']}"), Refused: "names database 2", Lint: path + "cluster_urls must list"},
		{Name: "redis cluster url database 0", Set: set("{cluster_urls: ['redis://127.0.0.1:7000/0', 'redis://127.0.0.1:7001/']}")},
		{Name: "redis url ignored for a cluster", Set: set("{url: 'http://x', cluster_urls: ['redis://127.0.0.1:7000']}")},
		{Name: "a redis CA file that is not there", Set: set("{tls: {enabled: true, root_cas_file: /nonexistent/ca.pem}}"), Refused: "no such file", Unlintable: FileMissing},
	}
}
