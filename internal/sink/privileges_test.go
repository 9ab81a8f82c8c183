package sink

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
)

// progressDDL is the progress table as an administrator creates it for a role that may not.
const progressDDL = `CREATE SCHEMA pgrelay;
CREATE TABLE pgrelay.sink_progress (sink text NOT NULL, queue text NOT NULL, shard integer NOT NULL,
  last_offset bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, queue, shard))`

// progressGrants are a sink role's privileges on the administrator's progress table.
var progressGrants = []string{`GRANT USAGE ON SCHEMA pgrelay TO %s`, `GRANT SELECT, INSERT, UPDATE ON pgrelay.sink_progress TO %s`}

// modeGrants are a sink role's privileges on its target (app.T stands for app.<role>_t), per mode:
// no CREATE anywhere, owner of nothing.
var modeGrants = map[Mode][]string{
	ModeAppend: {`GRANT USAGE ON SCHEMA app TO %s`, `GRANT INSERT ON app.T TO %s`},
	ModeUpsert: {`GRANT USAGE ON SCHEMA app TO %s`, `GRANT INSERT, UPDATE, SELECT ON app.T TO %s`},
	ModeCDC:    {`GRANT USAGE ON SCHEMA app TO %s`, `GRANT INSERT, UPDATE, SELECT, DELETE ON app.T TO %s`},
}

// rolePool is a pool connecting as role.
func (f *pgFixture) rolePool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	pc, err := pgconnect.Config{DSN: f.pg.UserDSN(role, "postgres")}.PoolConfig(4)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// roleApplier builds an Applier of table app.<role>_t as role; retries report their error to errs.
func (f *pgFixture) roleApplier(t *testing.T, role string, mode Mode, progress string, create bool, errs chan<- error) (*Applier, error) {
	cfg := Config{Name: role, Table: "app." + role + "_t", Mode: mode, ProgressTable: progress, CreateProgressTable: create,
		RequireProgress: true, RetryMax: 200 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return NewApplier(ctx, f.rolePool(t, role), cfg, func(err error, _ Class, _ time.Duration) {
		select {
		case errs <- err:
		default:
		}
	})
}

// TestLeastPrivilegeSink runs each mode as a role holding only the DML that mode needs on its target
// (append: INSERT; upsert: INSERT, UPDATE, SELECT; cdc: those and DELETE, and TRUNCATE once a
// truncate arrives) and SELECT, INSERT, UPDATE on a progress table an administrator created: the
// rows land. Then, for each privilege of that set, a role lacking only it is refused at start with
// its code and a fix naming the GRANT, and starts once that GRANT has run; a role without CREATE
// gets the GRANT that lets the sink create its progress table (on the schema, or on the database
// for a missing schema) or the administrator's DDL.
func TestLeastPrivilegeSink(t *testing.T) {
	f := startPG(t)
	ctx := context.Background()
	f.exec(t, `REVOKE CREATE ON SCHEMA public FROM PUBLIC; CREATE SCHEMA app; CREATE SCHEMA empty;`+progressDDL)
	newRole := func(role string, mode Mode, without string, extra ...string) {
		f.exec(t, `CREATE TABLE app.`+role+`_t (id int PRIMARY KEY, v text)`)
		var grants []string
		for _, g := range append(append(modeGrants[mode], progressGrants...), extra...) {
			g = strings.ReplaceAll(g, "app.T ", "app."+role+"_t ")
			if without == "" {
				grants = append(grants, g)
				continue
			}
			// Leave one privilege out of its GRANT.
			head, rest, _ := strings.Cut(g, " ON ")
			var keep []string
			for _, p := range strings.Split(strings.TrimPrefix(head, "GRANT "), ", ") {
				if !strings.HasPrefix(without, p+" ON ") || !strings.Contains(rest, strings.TrimPrefix(without, p+" ON ")) {
					keep = append(keep, p)
				}
			}
			if len(keep) > 0 {
				grants = append(grants, "GRANT "+strings.Join(keep, ", ")+" ON "+rest)
			}
		}
		f.pg.CreateRole(role, "LOGIN", grants...)
	}

	t.Run("each mode with exactly its privileges", func(t *testing.T) {
		ev := func(op, id, v string) string {
			after := `{"id":` + id + `,"v":"` + v + `"}`
			if op == "d" {
				after = "null"
			}
			return `{"op":"` + op + `","table":"public.x","key":{"id":` + id + `},"after":` + after + `,"before":null,"lsn":"0/1","ts":"2026-10-03T06:15:03Z","seq":0}`
		}
		for mode, batches := range map[Mode][][]string{
			ModeAppend: {{`{"id":1,"v":"a"}`, `{"id":2,"v":"b"}`}},
			ModeUpsert: {{`{"id":1,"v":"a"}`, `{"id":2,"v":"b"}`}, {`{"id":1,"v":"a2"}`}},
			ModeCDC:    {{ev("c", "1", "a"), ev("c", "2", "b"), ev("c", "3", "c")}, {ev("u", "1", "a2"), ev("d", "2", "")}},
		} {
			role := "min_" + string(mode)
			newRole(role, mode, "")
			errs := make(chan error, 1)
			a, err := f.roleApplier(t, role, mode, DefaultProgressTable, false, errs)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			offset := int64(0)
			for _, b := range batches {
				var msgs []*Message
				for _, p := range b {
					offset++
					msgs = append(msgs, msg("q_"+role, 0, offset, p))
				}
				write(t, a, msgs...)
			}
			want := map[Mode]string{ModeAppend: "1/a,2/b", ModeUpsert: "1/a2,2/b", ModeCDC: "1/a2,3/c"}[mode]
			if got := strings.Join(f.queryStrings(t, `SELECT concat_ws('/', id, v) FROM app.`+role+`_t ORDER BY id`), ","); got != want {
				t.Errorf("%s: rows %s, want %s", mode, got, want)
			}
			if mode != ModeCDC {
				continue
			}
			// A truncate needs TRUNCATE: the sink pauses with the GRANT, and applies it once granted.
			done := make(chan error, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				defer cancel()
				_, err := a.Write(wctx, []*Message{msg("q_"+role, 0, offset+1, `{"op":"t","table":"public.x"}`)})
				done <- err
			}()
			fix := `GRANT TRUNCATE ON "app"."min_cdc_t" TO "min_cdc"`
			if err := <-errs; !errcode.Is(err, errcode.TargetPrivileges) || !strings.Contains(err.Error(), "Fix: "+fix) {
				t.Fatalf("truncate without TRUNCATE: %v, want target_privileges and the fix %q", err, fix)
			}
			f.exec(t, fix)
			if err := <-done; err != nil {
				t.Fatalf("truncate after the grant: %v", err)
			}
			if n := f.one(t, `SELECT count(*)::text FROM app.min_cdc_t`); n != "0" {
				t.Errorf("%s rows left after the truncate", n)
			}
		}
	})

	t.Run("each missing privilege is named", func(t *testing.T) {
		cases := []struct {
			role, without string // without: the privilege left out of the grants, as "PRIV ON object"
			progress      string
			create        bool
			code          errcode.Code
			fix           string // the statement the error names, run to fix it
		}{
			{"no_usage", "USAGE ON SCHEMA app", DefaultProgressTable, false, errcode.TargetPrivileges, `GRANT USAGE ON SCHEMA "app" TO "no_usage"`},
			{"no_insert", "INSERT ON app.", DefaultProgressTable, false, errcode.TargetPrivileges, `GRANT INSERT ON "app"."no_insert_t" TO "no_insert"`},
			{"no_update", "UPDATE ON app.", DefaultProgressTable, false, errcode.TargetPrivileges, `GRANT UPDATE ON "app"."no_update_t" TO "no_update"`},
			{"no_select", "SELECT ON app.", DefaultProgressTable, false, errcode.TargetPrivileges, `GRANT SELECT ON "app"."no_select_t" TO "no_select"`},
			{"no_delete", "DELETE ON app.", DefaultProgressTable, false, errcode.TargetPrivileges, `GRANT DELETE ON "app"."no_delete_t" TO "no_delete"`},
			{"no_p_usage", "USAGE ON SCHEMA pgrelay", DefaultProgressTable, false, errcode.ProgressTablePrivileges, `GRANT USAGE ON SCHEMA "pgrelay" TO "no_p_usage"`},
			{"no_p_select", "SELECT ON pgrelay.", DefaultProgressTable, false, errcode.ProgressTablePrivileges, `GRANT SELECT ON "pgrelay"."sink_progress" TO "no_p_select"`},
			{"no_p_insert", "INSERT ON pgrelay.", DefaultProgressTable, false, errcode.ProgressTablePrivileges, `GRANT INSERT ON "pgrelay"."sink_progress" TO "no_p_insert"`},
			{"no_p_update", "UPDATE ON pgrelay.", DefaultProgressTable, false, errcode.ProgressTablePrivileges, `GRANT UPDATE ON "pgrelay"."sink_progress" TO "no_p_update"`},
			{"no_create_table", "", "empty.progress", true, errcode.ProgressTableCreate, `GRANT CREATE ON SCHEMA "empty" TO "no_create_table"`},
			{"no_create_schema", "", "own.progress", true, errcode.ProgressTableCreate, `GRANT CREATE ON DATABASE "postgres" TO "no_create_schema"`},
			{"no_progress_table", "", "empty.missing", false, errcode.ProgressTableMissing, "CREATE TABLE IF NOT EXISTS \"empty\".\"missing\""},
		}
		// Roles first: GRANTs on one schema from concurrent sessions fail with "tuple concurrently
		// updated", so the roles are made before the checks run in parallel and the fixes run one at
		// a time.
		for _, c := range cases {
			newRole(c.role, ModeCDC, c.without, `GRANT USAGE ON SCHEMA empty TO %s`)
		}
		var wg sync.WaitGroup
		var grantMu sync.Mutex
		for _, c := range cases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := f.roleApplier(t, c.role, ModeCDC, c.progress, c.create, nil)
				if errcode.Of(err) != c.code || !strings.Contains(err.Error(), "Fix: "+c.fix) && !strings.Contains(err.Error(), c.fix) {
					t.Errorf("%s: %v, want code %s and the fix %q", c.role, err, c.code, c.fix)
					return
				}
				var coded *errcode.Error
				errors.As(err, &coded)
				fix := c.fix
				if c.code == errcode.ProgressTableMissing { // the administrator's statements
					fix = coded.Fix[strings.Index(coded.Fix, "\n")+1 : strings.Index(coded.Fix, "\nor set")]
				}
				grantMu.Lock()
				_, err = f.pool.Exec(ctx, fix)
				grantMu.Unlock()
				if err != nil {
					t.Errorf("%s: run the fix: %v", c.role, err)
					return
				}
				if _, err := f.roleApplier(t, c.role, ModeCDC, c.progress, c.create, nil); err != nil {
					t.Errorf("%s: after %s: %v", c.role, fix, err)
				}
			}()
		}
		wg.Wait()
	})
}
