package queuecli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFromConfig(t *testing.T) {
	t.Setenv("PGRELAY_QCLI_URL", "redis://10.0.0.1:6390")
	cases := []struct {
		name, yaml          string
		url, prefix, queue  string
		clusterURLs, errSub string
	}{
		{"input, env reference", "input:\n  redis_queue:\n    url: ${PGRELAY_QCLI_URL}\n    queue: orders\n    group: g\n",
			"redis://10.0.0.1:6390", "pgrelay", "orders", "", ""},
		{"output, default of an unset env", "output:\n  redis_queue:\n    url: ${PGRELAY_QCLI_UNSET:redis://127.0.0.1:7000}\n    prefix: app\n    queue: ${! meta(\"queue\") }\n",
			"redis://127.0.0.1:7000", "app", "", "", ""},
		{"nested in a broker, cluster", "output:\n  broker:\n    outputs:\n      - drop: {}\n      - redis_queue:\n          cluster_urls: [ redis://a:1, redis://b:2 ]\n          queue: q\n",
			"redis://127.0.0.1:6379", "pgrelay", "q", "redis://a:1,redis://b:2", ""},
		{"no redis_queue", "input:\n  generate:\n    mapping: root = 1\n", "", "", "", "", "no redis_queue"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			conn, q, err := fromConfig(path)
			if c.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), c.errSub) {
					t.Fatalf("err %v, want %q", err, c.errSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if conn.URL != c.url || conn.Prefix != c.prefix || q != c.queue || strings.Join(conn.ClusterURLs, ",") != c.clusterURLs {
				t.Fatalf("got url %q prefix %q queue %q cluster %v", conn.URL, conn.Prefix, q, conn.ClusterURLs)
			}
		})
	}
}
