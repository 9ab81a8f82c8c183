package sink

import (
	"context"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestConnConfig(t *testing.T) {
	cases := []struct {
		name           string
		c              ConnConfig
		host, user, db string
		port           uint16
		password       string
		tls            bool
	}{
		{"fields only", ConnConfig{Host: "127.0.0.1", Port: 5433, User: "u", Password: "p'w", Database: "d", TLSMode: "disable"}, "127.0.0.1", "u", "d", 5433, "p'w", false},
		{"URL with fields overriding", ConnConfig{DSN: "postgres://a@h1:1/x?sslmode=disable", User: "b", Database: "y z"}, "h1", "b", "y z", 1, "", false},
		{"key=value DSN with password field", ConnConfig{DSN: "host=h2 port=2 user=c dbname=w sslmode=disable", Password: "s3cret"}, "h2", "c", "w", 2, "s3cret", false},
		{"tls require", ConnConfig{DSN: "host=h3 user=c", TLSMode: "require"}, "h3", "c", "", 5432, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool, err := c.c.Pool(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			cc := pool.Config().ConnConfig
			if cc.Host != c.host || cc.User != c.user || cc.Port != c.port || cc.Password != c.password || (c.db != "" && cc.Database != c.db) {
				t.Fatalf("got host=%s port=%d user=%s db=%s password=%q", cc.Host, cc.Port, cc.User, cc.Database, cc.Password)
			}
			if (cc.TLSConfig != nil) != c.tls {
				t.Fatalf("tls config %v", cc.TLSConfig)
			}
			if cc.RuntimeParams["timezone"] != "UTC" || cc.RuntimeParams["datestyle"] != "ISO, MDY" {
				t.Fatalf("session settings %v", cc.RuntimeParams)
			}
		})
	}
	_, err := ConnConfig{DSN: "postgres://u:hunter2@h/db?sslmode=bogus"}.Pool(context.Background())
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad dsn error %v (must not show the password)", err)
	}
	_, err = ConnConfig{TLSMode: "sometimes"}.Pool(context.Background())
	if !errcode.Is(err, "sink_config") {
		t.Fatalf("bad tls mode: %v", err)
	}
}
