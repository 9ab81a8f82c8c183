package redisconn

import "testing"

func TestKey(t *testing.T) {
	cases := []struct {
		prefix, queue string
		parts         []string
		want          string
	}{
		{"pgrelay", "orders", []string{"s", "3"}, "pgrelay:{orders}:s:3"},
		{"x", "q", nil, "x:{q}"},
		{"pgrelay", "q", []string{"src", "main", "lease"}, "pgrelay:{q}:src:main:lease"},
	}
	for _, c := range cases {
		if got := Key(c.prefix, c.queue, c.parts...); got != c.want {
			t.Errorf("Key = %q, want %q", got, c.want)
		}
	}
}

func TestValidateAndRedact(t *testing.T) {
	if err := (Config{URL: "redis://127.0.0.1:6379"}).Validate(); err != nil {
		t.Fatal(err)
	}
	err := (Config{URL: "http://u:secret@h:1"}).Validate()
	if err == nil {
		t.Fatal("bad scheme accepted")
	}
	if got := err.Error(); contains(got, "secret") {
		t.Fatalf("password leaked into error: %s", got)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
