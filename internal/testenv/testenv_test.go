package testenv

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/redis/go-redis/v9"
)

// TestPostgresVersionsDecodeOneChange starts each supported PostgreSQL, creates a pgoutput slot and
// decodes one insert through pglogrepl.
func TestPostgresVersionsDecodeOneChange(t *testing.T) {
	for _, major := range []int{15, 17, 18} {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			t.Parallel()
			bin := PostgresBins()[major]
			if bin == "" {
				missing(t, fmt.Sprintf("PostgreSQL %d", major))
			}
			pg := StartPostgres(t, WithPGBin(bin))
			if pg.Version != major {
				t.Fatalf("version %d, want %d", pg.Version, major)
			}
			decodeOneInsert(t, pg)
		})
	}
}

func decodeOneInsert(t *testing.T, pg *Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg.Exec(`CREATE TABLE t (id int PRIMARY KEY, v text)`)
	pg.Exec(`CREATE PUBLICATION p FOR TABLE t`)
	conn, err := pgconn.Connect(ctx, pg.DSN()+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, "s", "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{}); err != nil {
		t.Fatal(err)
	}
	pg.Exec(`INSERT INTO t VALUES (42, 'hello')`)
	err = pglogrepl.StartReplication(ctx, conn, "s", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}})
	if err != nil {
		t.Fatal(err)
	}
	rels := map[uint32]*pglogrepl.RelationMessage{}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		lm, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			t.Fatal(err)
		}
		switch m := lm.(type) {
		case *pglogrepl.RelationMessage:
			rels[m.RelationID] = m
		case *pglogrepl.InsertMessage:
			rel := rels[m.RelationID]
			if rel == nil || rel.RelationName != "t" {
				t.Fatalf("insert for unknown relation %d", m.RelationID)
			}
			got := fmt.Sprintf("%s=%s %s=%s", rel.Columns[0].Name, m.Tuple.Columns[0].Data,
				rel.Columns[1].Name, m.Tuple.Columns[1].Data)
			if got != "id=42 v=hello" {
				t.Fatalf("decoded %q", got)
			}
			return
		}
	}
}

func TestRedisXAddRoundTrip(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, c redis.Cmdable, stream string) {
		id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"d", "payload"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.XRange(ctx, stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != id || got[0].Values["d"] != "payload" {
			t.Fatalf("read back %+v", got)
		}
	}
	t.Run("plain", func(t *testing.T) {
		t.Parallel()
		r := StartRedis(t)
		check(t, r.Client(), "pgrelay:{q}:s:0")
		// The write survives a SIGKILL (appendfsync always).
		r.Kill()
		r.Restart()
		n, err := r.Client().XLen(ctx, "pgrelay:{q}:s:0").Result()
		if err != nil || n != 1 {
			t.Fatalf("after restart: len %d err %v", n, err)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		rc := StartRedisCluster(t)
		c := rc.Client(t)
		for _, q := range []string{"a", "b", "c", "d"} {
			check(t, c, "pgrelay:{"+q+"}:s:0")
		}
	})
}

func TestPostgresKillRestartAndSecondDatabase(t *testing.T) {
	pg := StartPostgres(t)
	pg.Exec(`CREATE TABLE k (id int)`)
	pg.Exec(`INSERT INTO k VALUES (1)`)
	pg.Kill()
	pg.Restart()
	var n int
	if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*) FROM k`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("after restart: %d %v", n, err)
	}
	dsn := pg.CreateDatabase("second")
	conn, err := pgconn.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
}

// TestRedisRestartAfterTornTransaction restarts Redis on an append-only file whose last MULTI …
// EXEC block was cut inside a command, as a SIGKILL in the middle of the server's write of it
// leaves it, then writes a second transaction, kills Redis again and restarts it. The cut
// transaction never applies and the second one does. Redis 7.0 alone gets this wrong: loading the
// cut file it drops only the cut command, keeps the block's MULTI and first commands in the file
// and appends after them, so the next load runs those commands inside the second transaction (the
// first transaction half applied, and applied after the one written after it). Restart therefore
// has Redis rewrite its file from memory after a load that truncated it (see Restart).
func TestRedisRestartAfterTornTransaction(t *testing.T) {
	ctx := context.Background()
	r := StartRedis(t)
	c := r.Client()
	tx := func(kv ...string) {
		t.Helper()
		if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for i := 0; i < len(kv); i += 2 {
				p.Set(ctx, kv[i], kv[i+1], 0)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tx("a", "1", "b", "2")
	r.Kill()
	// cut the file inside SET b, the block's last command before EXEC (*1\r\n$4\r\nEXEC\r\n: 14 bytes)
	incr := filepath.Join(r.Dir, "appendonlydir", "appendonly.aof.1.incr.aof")
	data, err := os.ReadFile(incr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(data, []byte("$1\r\nb\r\n$1\r\n2\r\n*1\r\n$4\r\nEXEC\r\n")) {
		t.Fatalf("the append-only file does not end with the transaction: %q", data[max(0, len(data)-80):])
	}
	if err := os.Truncate(incr, int64(len(data)-20)); err != nil {
		t.Fatal(err)
	}
	r.Restart()
	tx("c", "3", "d", "4")
	r.Kill()
	r.Restart()
	got := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d"} {
		got[k] = c.Get(ctx, k).Val()
	}
	if want := map[string]string{"a": "", "b": "", "c": "3", "d": "4"}; !maps.Equal(got, want) {
		log, _ := os.ReadFile(filepath.Join(r.Dir, "redis.log"))
		t.Fatalf("after the second restart %v, want %v (the cut transaction not applied, the second one applied); redis.log:\n%s", got, want, log)
	}
}

// A port taken by another process between FreePort and the server's bind (the test packages run
// several at once, each with its own servers) is replaced by another: the server starts.
func TestPostgresStartsWhenItsPortIsTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	pg := StartPostgres(t, func(o *pgOptions) { o.port = taken })
	if pg.Port == taken {
		t.Fatalf("the server reports the taken port %d", taken)
	}
	var one int
	if err := pg.Pool().QueryRow(context.Background(), `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("the server on port %d: %d %v", pg.Port, one, err)
	}
}

// A port held by another PostgreSQL server (another test process's) is not taken for this
// server's: the other one answers on it, so readiness waits for this server's own data directory,
// sees this one exit on the taken port, and starts it on another.
func TestPostgresDoesNotTakeAnotherServerForItself(t *testing.T) {
	other := StartPostgres(t)
	pg := StartPostgres(t, func(o *pgOptions) { o.port = other.Port })
	if pg.Port == other.Port {
		t.Fatalf("the new server reports the other server's port %d", other.Port)
	}
	var dir string
	if err := pg.Pool().QueryRow(context.Background(), `SHOW data_directory`).Scan(&dir); err != nil {
		t.Fatal(err)
	}
	if !samePath(dir, pg.DataDir) {
		t.Fatalf("port %d is answered by data directory %s, want %s", pg.Port, dir, pg.DataDir)
	}
}

// The same for Redis: a port held by another redis-server is not taken for this one's (INFO's
// process_id tells them apart); the new server starts on another port.
func TestRedisDoesNotTakeAnotherServerForItself(t *testing.T) {
	other := StartRedis(t)
	first := true
	r := startRedisOn(t, func(r *Redis) []string { return []string{"--port", fmt.Sprint(r.Port)} }, func(r *Redis) {
		if first {
			r.Port, first = other.Port, false
		}
	})
	if r.Port == other.Port {
		t.Fatalf("the new server reports the other server's port %d", other.Port)
	}
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := parseInfo(info)["process_id"], strconv.Itoa(r.proc.current().cmd.Process.Pid); got != want {
		t.Fatalf("port %d is answered by pid %s, want the new server's %s", r.Port, got, want)
	}
}

// Servers are copies of one initdb (pgtemplate.go), each with a system identifier of its own, as
// pg_control_system() and the replication protocol report it; a copy starts, writes and restarts.
func TestPostgresServersHaveTheirOwnSystem(t *testing.T) {
	ids := map[string]bool{}
	for i := 0; i < 2; i++ {
		pg := StartPostgres(t)
		var id, viaRepl string
		if err := pg.Pool().QueryRow(context.Background(), `SELECT system_identifier::text FROM pg_control_system()`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		conn, err := pgconn.Connect(context.Background(), pg.DSN()+"&replication=database")
		if err != nil {
			t.Fatal(err)
		}
		sys, err := pglogrepl.IdentifySystem(context.Background(), conn)
		conn.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		viaRepl = sys.SystemID
		if id != viaRepl || ids[id] {
			t.Fatalf("server %d: system %s (replication: %s), seen before: %v", i, id, viaRepl, ids[id])
		}
		ids[id] = true
		pg.Exec(`CREATE TABLE k (id int); INSERT INTO k VALUES (1); CHECKPOINT`)
		pg.Kill()
		pg.Restart()
		var n int
		if err := pg.Pool().QueryRow(context.Background(), `SELECT count(*) FROM k`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("server %d after restart: %d %v", i, n, err)
		}
	}
}
