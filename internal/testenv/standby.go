package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a physical streaming standby of a running primary (started by StartPostgres
// without TLS) and returns it once the primary sees it streaming; it is stopped when the test ends.
//
// It works without pg_basebackup (the npm builds lack it): a physical slot on the primary named
// StandbyName keeps the WAL, a non-exclusive backup (pg_backup_start and pg_backup_stop on one
// connection) brackets a copy of the data directory, and the standby gets backup_label and
// tablespace_map from pg_backup_stop, standby.signal, primary_conninfo (with dbname, which slot
// synchronisation needs, and application_name = StandbyName), primary_slot_name = StandbyName and
// hot_standby_feedback = on. WithPGSetting adds settings (e.g. sync_replication_slots = on); the
// other options are ignored (the standby runs the primary's binaries).
func StartStandby(t testing.TB, primary *Postgres, opts ...PGOption) *Postgres {
	t.Helper()
	if primary.TLS != nil {
		t.Fatal("testenv: StartStandby needs a primary without TLS")
	}
	var o pgOptions
	for _, opt := range opts {
		opt(&o)
	}
	base := tempDir(t, "pg")
	sb := &Postgres{t: t, BinDir: primary.BinDir, Version: primary.Version, DataDir: filepath.Join(base, "data"), Port: FreePort(t)}
	sb.StandbyName = fmt.Sprintf("standby_%d", sb.Port)
	primary.Exec(`SELECT pg_create_physical_replication_slot($1, true)`, sb.StandbyName)
	if err := baseBackup(primary, sb.DataDir); err != nil {
		t.Fatalf("testenv: base backup for %s: %v", sb.StandbyName, err)
	}
	if err := writeServerFile(filepath.Join(sb.DataDir, "standby.signal"), nil); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	conf := []string{
		fmt.Sprintf("port = %d", sb.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", base),
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s sslmode=disable'",
			primary.Port, sb.StandbyName),
		fmt.Sprintf("primary_slot_name = '%s'", sb.StandbyName),
		"hot_standby_feedback = on",
	}
	conf = append(conf, o.conf...)
	if err := appendConf(sb.DataDir, conf...); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	sb.startFirst()
	t.Cleanup(sb.Stop)
	sb.waitStreaming(primary)
	return sb
}

// baseBackup copies the primary's data directory into dst inside a non-exclusive backup and
// writes the backup_label (and tablespace_map) that pg_backup_stop returns.
func baseBackup(primary *Postgres, dst string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, primary.DSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	start, stop := `SELECT pg_backup_start('pgrelay testenv', true)`, `SELECT labelfile, spcmapfile FROM pg_backup_stop(false)`
	if primary.Version < 15 {
		start, stop = `SELECT pg_start_backup('pgrelay testenv', true, false)`, `SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)`
	}
	if _, err := conn.Exec(ctx, start); err != nil {
		return fmt.Errorf("start backup: %w", err)
	}
	if err := copyDataDir(primary.DataDir, dst); err != nil {
		return err
	}
	var label string
	var spcmap *string
	if err := conn.QueryRow(ctx, stop).Scan(&label, &spcmap); err != nil {
		return fmt.Errorf("stop backup: %w", err)
	}
	if err := writeServerFile(filepath.Join(dst, "backup_label"), []byte(label)); err != nil {
		return err
	}
	if spcmap != nil && *spcmap != "" {
		return writeServerFile(filepath.Join(dst, "tablespace_map"), []byte(*spcmap))
	}
	return nil
}

// copyDataDir copies a running server's data directory, leaving out what the documentation of the
// low-level backup API says to omit: the contents of pg_wal (the standby streams it through its
// slot), pg_replslot (slots are not copied) and the runtime directories, the pid file and
// temporary files. Files that vanish during the copy are skipped; WAL replay makes the rest
// consistent.
func copyDataDir(src, dst string) error {
	emptied := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_dynshmem": true, "pg_notify": true,
		"pg_serial": true, "pg_snapshots": true, "pg_stat_tmp": true, "pg_subtrans": true}
	skipped := map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label": true,
		"tablespace_map": true, "pg_internal.init": true}
	return copyTree(src, dst, func(rel string, d fs.DirEntry) (keep bool, skipDir bool) {
		if skipped[d.Name()] || strings.HasPrefix(d.Name(), "pgsql_tmp") {
			return false, d.IsDir()
		}
		parent := strings.SplitN(rel, string(filepath.Separator), 2)[0]
		return !emptied[parent] || rel == parent, false
	})
}

// copyTree copies the directories and regular files of src to dst with their modes, owned by the
// service user when the tests run as root. pick (nil: everything) says for each entry whether it
// is copied and, for a directory, whether its contents are skipped. Files that vanish during the
// copy are skipped.
func copyTree(src, dst string, pick func(rel string, d fs.DirEntry) (keep bool, skipDir bool)) error {
	cred, _, err := serviceUser()
	if err != nil {
		return err
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if pick != nil {
			if keep, skipDir := pick(rel, d); skipDir {
				return fs.SkipDir
			} else if !keep {
				return nil
			}
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			err = os.MkdirAll(target, info.Mode().Perm())
		} else if info.Mode().IsRegular() {
			err = copyFile(path, target, info.Mode().Perm())
		} else {
			return nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err == nil && cred != nil {
			err = os.Chown(target, int(cred.Uid), int(cred.Gid))
		}
		return err
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// waitStreaming waits until the primary's pg_stat_replication shows this standby streaming.
func (pg *Postgres) waitStreaming(primary *Postgres) {
	pg.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		err := primary.Pool().QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, pg.StandbyName).Scan(&n)
		if err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			pg.t.Fatalf("testenv: standby %s not streaming after 60 s (%v)\n%s", pg.StandbyName, err,
				tail(filepath.Join(filepath.Dir(pg.DataDir), "postgres.log")))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Promote ends recovery on a standby (pg_promote, waiting up to 60 s): it becomes a primary on
// the same port.
func (pg *Postgres) Promote() {
	pg.t.Helper()
	var ok bool
	if err := pg.Pool().QueryRow(context.Background(), `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil || !ok {
		pg.t.Fatalf("testenv: promote %s: %v (promoted %v)", pg.StandbyName, err, ok)
	}
}
