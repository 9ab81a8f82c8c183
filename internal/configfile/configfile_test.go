package configfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestResolveEnv(t *testing.T) {
	t.Setenv("PGRELAY_T_SET", "value")
	t.Setenv("PGRELAY_T_EMPTY", "")
	cases := []struct{ in, want string }{
		{"${PGRELAY_T_SET}", "value"},
		{"${PGRELAY_T_SET:default}", "value"},
		{"${PGRELAY_T_UNSET:redis://127.0.0.1:6379}", "redis://127.0.0.1:6379"},
		{"${PGRELAY_T_EMPTY:fallback}", "fallback"},
		{"${PGRELAY_T_UNSET}", ""},
		{"a ${PGRELAY_T_SET} b ${PGRELAY_T_UNSET:c}", "a value b c"},
		{`${! meta("queue") }`, `${! meta("queue") }`}, // interpolation, not an env reference
	}
	for _, c := range cases {
		if got := ResolveEnv(c.in); got != c.want {
			t.Errorf("ResolveEnv(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Setenv("PGRELAY_T_Q", "orders")
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("output:\n  redis_queue:\n    queue: ${PGRELAY_T_Q}\n"), 0o644)
	doc, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	q := doc.(map[string]any)["output"].(map[string]any)["redis_queue"].(map[string]any)["queue"]
	if q != "orders" {
		t.Fatalf("queue %v", q)
	}
	os.WriteFile(path, []byte("a: [\n"), 0o644)
	if _, err := Load(path); err == nil {
		t.Fatal("bad YAML accepted")
	}
}
