// Package configfile reads a Benthos pipeline config the way pgrelay's subcommands need it (status,
// teardown, resync, queue -c): as a YAML document with environment references resolved as Benthos
// resolves them, so a subcommand sees the same values as the running pipeline.
package configfile

import (
	"fmt"
	"os"
	"regexp"

	"gopkg.in/yaml.v3"
)

// envRef is a Benthos environment reference: ${NAME} or ${NAME:default}.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}`)

// ResolveEnv replaces every ${NAME} and ${NAME:default} in text: the variable's value, or the
// default when it is unset or empty (as Benthos does).
func ResolveEnv(text string) string {
	return envRef.ReplaceAllStringFunc(text, func(ref string) string {
		m := envRef.FindStringSubmatch(ref)
		if v := os.Getenv(m[1]); v != "" {
			return v
		}
		return m[2]
	})
}

// HasEnvRef reports whether s still holds an environment reference.
func HasEnvRef(s string) bool { return envRef.MatchString(s) }

// Load reads the config at path with environment references resolved and parses it as YAML.
func Load(path string) (any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal([]byte(ResolveEnv(string(raw))), &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return doc, nil
}
