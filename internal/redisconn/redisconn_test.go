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
	for _, u := range []string{"http://u:secret@h:1", "redis://u:secret@h:notaport", "redis://u:secret@[::1", "redis://:secret@h:1/x"} {
		err := (Config{URL: u}).Validate()
		if err == nil {
			t.Fatalf("%s accepted", redact(u))
		}
		if got := err.Error(); contains(got, "secret") {
			t.Errorf("password leaked into error: %s", got)
		}
		if _, err := (Config{ClusterURLs: []string{u}}).Client(); err == nil || contains(err.Error(), "secret") {
			t.Errorf("cluster_urls %s: %v", redact(u), err)
		}
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
