package source

import (
	"context"
	"testing"

	"github.com/pgrelay/pgrelay/internal/pointer"
)

// TestBuildAhead checks what the bundler may do while a batch is in flight: only a full bundle
// is built, and nothing writes the pointer (the replication session under test has no writer: a write would panic).
func TestBuildAhead(t *testing.T) {
	start := pointer.New(1, "e", "s", "x", 100)
	ctx := context.Background()

	ss := testSession(4, start, change(200, 0, 1), change(200, 1, 1), commitItem(200))
	if b, _, err := ss.build(ctx, true); b != nil || err != nil {
		t.Fatalf("a bundle below the limit was built ahead: %v %v", b, err)
	}
	if items, _ := ss.q.peek(); len(items) != 3 || ss.plan.Position() != start.Position() {
		t.Fatalf("building ahead consumed items or moved the plan: %d items, plan %s", len(items), ss.plan.Position())
	}

	ss = testSession(4, start, positionItem(500))
	if b, _, err := ss.build(ctx, true); b != nil || err != nil {
		t.Fatalf("an idle advance was attempted ahead: %v %v", b, err)
	}

	ss = testSession(2, start, change(200, 0, 1), change(200, 1, 1), change(200, 2, 1), commitItem(200))
	b, _, err := ss.build(ctx, true)
	if err != nil || b == nil || len(b.Events) != 2 || b.Cover.InTxn == nil || b.Cover.InTxn.Done != 2 {
		t.Fatalf("a full bundle was not built ahead as a piece of the transaction: %+v %v", b, err)
	}
}

// TestItemQueueWhenFull checks that whenFull fires once a full bundle is queued, not before.
func TestItemQueueWhenFull(t *testing.T) {
	q := newItemQueue(2, 1<<20)
	full := q.whenFull()
	q.tryPush(change(200, 0, 1))
	select {
	case <-full:
		t.Fatal("fired with half a bundle")
	default:
	}
	q.tryPush(change(200, 1, 1))
	select {
	case <-full:
	default:
		t.Fatal("did not fire with a full bundle")
	}
	select {
	case <-q.whenFull():
	default:
		t.Fatal("a new wait on a full queue must fire at once")
	}
}
