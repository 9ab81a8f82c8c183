package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// runCommand runs one of pgrelay's subcommands in-process and returns what it printed and its
// error (a cli.ExitCoder for a failure).
func runCommand(cmd *cli.Command, args ...string) (string, error) {
	var out strings.Builder
	app := &cli.App{Name: "pgrelay", Writer: &out, ErrWriter: &out, Commands: []*cli.Command{cmd},
		ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run(append([]string{"pgrelay"}, args...))
	return out.String(), err
}

// TestQueueConfigWithTLS: `pgrelay queue info -c` connects with the pipeline's tls block (CA and
// client certificate) to a Redis that speaks only TLS and requires a client certificate; a tls
// block naming another CA is refused.
func TestQueueConfigWithTLS(t *testing.T) {
	r := testenv.StartRedisTLS(t)
	w := queue.NewWriter(r.Client(), queue.WriterConfig{Shards: 2})
	msgs := make([]queue.Message, 5)
	for i := range msgs {
		msgs[i] = queue.Message{Queue: "tq", Partition: fmt.Sprint(i), ID: fmt.Sprint("m", i), Payload: []byte(`{}`)}
	}
	if _, err := w.Write(context.Background(), msgs, nil); err != nil {
		t.Fatal(err)
	}
	config := func(ca string) string {
		return writeConfig(t, fmt.Sprintf(`
input:
  redis_queue:
    url: %s
    queue: tq
    group: g
    tls:
      enabled: true
      root_cas_file: %s
      client_certs:
        - cert_file: %s
          key_file: %s
output:
  drop: {}
`, r.URL(), ca, r.TLS.ClientCertFile, r.TLS.ClientKeyFile))
	}
	out, err := runCommand(Queue(), "queue", "info", "-c", config(r.TLS.CAFile), "--json", "--timeout", "20s")
	if err != nil {
		t.Fatalf("queue info -c over TLS: %v\n%s", err, out)
	}
	var info queue.Info
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if info.Queue != "tq" || info.Shards != 2 || info.Length != 5 {
		t.Fatalf("info %+v", info)
	}
	out, err = runCommand(Queue(), "queue", "info", "-c", config(r.TLS.OtherCAFile), "--timeout", "5s")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server certificate of an untrusted CA was accepted: %v\n%s", err, out)
	}
}
