package sink

import (
	"context"
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
