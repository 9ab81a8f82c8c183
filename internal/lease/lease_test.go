package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/testenv"
)

func TestLeaseLifecycle(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client()
	a := New(rdb, "pgrelay:{q}:src:x:lease", 300*time.Millisecond, "a")
	b := New(rdb, "pgrelay:{q}:src:x:lease", 300*time.Millisecond, "b")

	steps := []struct {
		name string
		do   func() (bool, error)
		want bool
	}{
		{"a acquires", func() (bool, error) { return a.TryAcquire(ctx) }, true},
		{"b refused", func() (bool, error) { return b.TryAcquire(ctx) }, false},
		{"a re-acquires its own", func() (bool, error) { return a.TryAcquire(ctx) }, true},
		{"a renews", func() (bool, error) { return a.Renew(ctx) }, true},
	}
	for _, s := range steps {
		got, err := s.do()
		if err != nil || got != s.want {
			t.Fatalf("%s: got %v err %v", s.name, got, err)
		}
	}
	tokA := a.Token()
	if !strings.HasPrefix(tokA, "a|") {
		t.Fatalf("token %q", tokA)
	}
	// Expiry: b takes over with a larger fence; a's renew fails and a loses its token.
	time.Sleep(400 * time.Millisecond)
	if ok, err := b.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("b after expiry: %v %v", ok, err)
	}
	if b.Token() <= tokA[:0] || b.Token() == tokA {
		t.Fatalf("b token %q vs a %q", b.Token(), tokA)
	}
	if ok, _ := a.Renew(ctx); ok || a.Token() != "" {
		t.Fatal("a renewed a lost lease")
	}
	// Release by a non-holder does nothing; by the holder frees at once.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := Holder(ctx, rdb, b.Key()); v != b.Token() {
		t.Fatalf("holder %q", v)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := Holder(ctx, rdb, b.Key()); v != "" {
		t.Fatalf("still held by %q", v)
	}
	if ok, _ := a.TryAcquire(ctx); !ok || a.Token() != "a|3" {
		t.Fatalf("a after release: token %q", a.Token())
	}
}
