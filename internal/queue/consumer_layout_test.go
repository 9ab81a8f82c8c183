package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/cdctest"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// errorLog keeps the consumer's Errorf lines.
type errorLog struct {
	nopLogger
	mu    sync.Mutex
	lines []string
}

func (l *errorLog) Errorf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *errorLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestConsumerRefusesUnknownLayout: a queue whose meta names a layout version this code does not
// read (one a later pgrelay created) is refused with layout_version, at Start when it exists then
// and at setup when it appears later, and nothing of it is delivered or acknowledged; once the
// version is one it reads, the same entry is delivered. Queues without a version (the first
// layout's producers), of version 1 and of version 2 are read.
func TestConsumerRefusesUnknownLayout(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout(DefaultPrefix)
	v1 := []any{FieldOffset, "1", FieldPartition, "k", FieldID, "pg:1:0000000000000001:0", FieldTx, "7",
		FieldCreated, "1700000000000", FieldHeader, "", FieldPayload, `{"op":"c"}`}
	v2 := []any{FieldMeta, `{"off":1,"p":"k","id":"pg:1:0000000000000001:0","tx":"7","ts":1700000000000}`, FieldPayload, `{"op":"c"}`}
	// create makes queue q of one shard, its meta's version being version ("": none), holding one
	// entry of fields.
	create := func(q, version string, fields []any) {
		t.Helper()
		args := []any{"shards", "1", "off:0", "1"}
		if version != "" {
			args = append(args, "version", version)
		}
		if err := rdb.HSet(ctx, l.Meta(q), args...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.Stream(q, 0), Values: fields}).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// known versions, and none (a queue the first layout's producers created, of version-1 entries)
	for _, k := range []struct {
		version string
		fields  []any
	}{{"", v1}, {"1", v1}, {"2", v2}} {
		q := "known" + k.version
		create(q, k.version, k.fields)
		c := newConsumer(t, rdb, ConsumerConfig{Queue: q})
		d := read(t, c, 10*time.Second)
		if len(d.Entries) != 1 || d.Entries[0].MessageID != "pg:1:0000000000000001:0" || string(d.Entries[0].Payload) != `{"op":"c"}` {
			t.Fatalf("version %q: delivered %+v", k.version, d.Entries)
		}
	}

	// an existing queue of version 4: Start refuses it, naming the version and the fix
	create("later", "4", v2)
	c, err := NewConsumer(rdb, ConsumerConfig{Queue: "later", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); !errcode.Is(err, errcode.LayoutVersion) || !strings.Contains(err.Error(), "layout version 4") {
		t.Fatalf("start on a version-3 queue: %v", err)
	}
	if groups, _ := rdb.XInfoGroups(ctx, l.Stream("later", 0)).Result(); len(groups) != 0 {
		t.Fatalf("groups created on a refused queue: %+v", groups)
	}

	// a queue that appears (in version 4) after the consumer started: refused at setup, logged as
	// an error, nothing delivered (Read says the replica is not ready, holding no shard); then
	// ready and readable once its version is one this code reads
	log := &errorLog{}
	c = newConsumer(t, rdb, ConsumerConfig{Queue: "appears", Logger: log})
	create("appears", "4", v2)
	cdctest.Wait(t, 10*time.Second, "the layout_version error logged", func() (bool, string) {
		return strings.Contains(log.text(), "layout_version") && strings.Contains(log.text(), "layout version 4"), log.text()
	})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // not ready a lease TTL after the first refusal
	d, err := c.Read(rctx)
	cancel()
	if err == nil {
		t.Fatalf("delivered from a version-3 queue: %+v", d.Entries)
	}
	if !errors.Is(err, ErrNotReady) || !errcode.Is(err, errcode.LayoutVersion) {
		t.Fatalf("read from a refused queue: %v, want ErrNotReady for layout_version", err)
	}
	if groups, _ := rdb.XInfoGroups(ctx, l.Stream("appears", 0)).Result(); len(groups) != 0 {
		t.Fatalf("groups created on a refused queue: %+v", groups)
	}
	rdb.HSet(ctx, l.Meta("appears"), "version", "2")
	if err := c.WaitReady(ctx, 10*time.Second); err != nil { // as the input's Connect does
		t.Fatalf("not ready once the version is 2: %v", err)
	}
	d = read(t, c, 10*time.Second)
	if len(d.Entries) != 1 || d.Entries[0].MessageID != "pg:1:0000000000000001:0" {
		t.Fatalf("after the version was set to 2: %+v", d.Entries)
	}
}
