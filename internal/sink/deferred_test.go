package sink

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDeferredConstraintFailsTheMessage: a message violating a DEFERRABLE INITIALLY DEFERRED
// foreign key fails at COMMIT, not at its statement. That is a data error (class 23): it must fail
// that message (dead-lettered after max_attempts), not pause the sink on the shard for ever.
func TestDeferredConstraintFailsTheMessage(t *testing.T) {
	f := startPG(t)
	parent, child := f.name("parent"), f.name("child")
	f.exec(t, `CREATE TABLE `+parent+` (id int PRIMARY KEY)`)
	f.exec(t, `INSERT INTO `+parent+` VALUES (1)`)
	f.exec(t, `CREATE TABLE `+child+` (id int PRIMARY KEY, parent int REFERENCES `+parent+` DEFERRABLE INITIALLY DEFERRED)`)
	a := f.applier(t, Config{Table: "public." + child, Mode: ModeUpsert})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := a.Write(ctx, []*Message{
		msg("q", 0, 1, `{"id":1,"parent":1}`),
		msg("q", 0, 2, `{"id":2,"parent":99}`),
		msg("q", 1, 1, `{"id":3,"parent":1}`),
	})
	if err != nil {
		t.Fatalf("Write: %v (the deferred violation paused the sink instead of failing its message)", err)
	}
	if res.Outcomes[0] != Applied || res.Outcomes[1] != Failed || res.Outcomes[2] != Applied {
		t.Fatalf("outcomes %v errs %v", res.Outcomes, res.Errs)
	}
	if got := f.one(t, `SELECT string_agg(id::text, ',' ORDER BY id) FROM `+child); got != "1,3" {
		t.Fatalf("rows %s", got)
	}
}

// TestDeferredConstraintWithinAMessage: once a deferred violation has made the batch go message by
// message with constraints checked early, each message's deferred constraints are checked at the
// message's end, not at each statement: an envelope whose source transaction relied on the
// deferral (an item written before its order) is applied, and only the violating messages fail.
// An envelope whose violation is found only at its end is not charged to one of its events (an
// event-by-event replay that checked each statement would blame the item written before its order).
func TestDeferredConstraintWithinAMessage(t *testing.T) {
	f := startPG(t)
	f.exec(t, `CREATE SCHEMA dfr;
		CREATE TABLE dfr.orders (id int PRIMARY KEY);
		CREATE TABLE dfr.items (id int PRIMARY KEY, order_id int NOT NULL REFERENCES dfr.orders DEFERRABLE INITIALLY DEFERRED)`)
	a := f.applier(t, Config{Mode: ModeCDC, Tables: map[string]string{"public.*": "dfr.*"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := a.Write(ctx, []*Message{
		msg("q", 0, 1, envelope(fkEvent("c", "public.items", 1, 1), fkEvent("c", "public.orders", 1, 0))),
		msg("q", 1, 1, fkEvent("c", "public.items", 2, 999)),
		msg("q", 2, 1, fkEvent("c", "public.items", 3, 1)),
		msg("q", 3, 1, envelope(fkEvent("c", "public.items", 5, 5), fkEvent("c", "public.orders", 5, 0), fkEvent("c", "public.items", 6, 998))),
	})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if res.Outcomes[0] != Applied || res.Outcomes[1] != Failed || res.Outcomes[2] != Applied || res.Outcomes[3] != Failed {
		t.Fatalf("outcomes %v errs %v", res.Outcomes, res.Errs)
	}
	if err := res.Errs[3].Error(); !strings.Contains(err, "(order_id)=(998)") || strings.Contains(err, "envelope event") {
		t.Errorf("the envelope violating at its end: %s, want the violation, no event named", err)
	}
	if got := f.one(t, `SELECT (SELECT string_agg(id::text, ',') FROM dfr.orders) || '/' || (SELECT string_agg(id::text, ',' ORDER BY id) FROM dfr.items)`); got != "1/1,3" {
		t.Fatalf("rows %s", got)
	}
}
