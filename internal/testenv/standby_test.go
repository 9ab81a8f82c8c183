package testenv

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestStandbyFollowsAndIsPromoted: a standby made by StartStandby from a primary under writes has
// the rows committed before and after the backup, refuses writes, and after the primary is killed
// and it is promoted takes writes on its own port.
func TestStandbyFollowsAndIsPromoted(t *testing.T) {
	ctx := context.Background()
	primary := StartPostgres(t)
	primary.Exec(`CREATE TABLE s (id int PRIMARY KEY)`)
	primary.Exec(`INSERT INTO s SELECT generate_series(1, 1000)`)
	standby := StartStandby(t, primary)
	primary.Exec(`INSERT INTO s VALUES (1001)`)
	count := func() int {
		var n int
		if err := standby.Pool().QueryRow(ctx, `SELECT count(*) FROM s`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for count() != 1001 {
		if time.Now().After(deadline) {
			t.Fatalf("standby has %d rows, want 1001", count())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := standby.Pool().Exec(ctx, `INSERT INTO s VALUES (0)`); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a write on the standby: %v, want read-only", err)
	}
	primary.Kill()
	standby.Promote()
	standby.Exec(`INSERT INTO s VALUES (0)`)
	if n := count(); n != 1002 {
		t.Fatalf("promoted standby has %d rows, want 1002", n)
	}
}
