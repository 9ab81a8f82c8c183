package testenv

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// A new server's data directory is a copy of one initdb per PostgreSQL bin directory, kept in
// the repository's .cache/pg-template: initdb costs about a second of CPU, mostly the kernel's,
// and the test suite starts hundreds of servers; a copy costs a tenth of that. Each copy gets a
// system identifier of its own (pg_control and the WAL's long page headers), as a server of its
// own initdb would have, so a source that meets another server still sees another system.

// initdbArgs are the arguments of every server's initdb (after -D).
var initdbArgs = []string{"-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"}

var templateMu sync.Mutex // one initdb at a time per process; os.Rename makes it one per directory

// newDataDir fills dataDir (not existing yet; its parent is the test's temporary directory) with
// a copy of binDir's template, made first if there is none.
func newDataDir(binDir, dataDir string) error {
	tmpl, err := dataTemplate(binDir)
	if err != nil {
		return err
	}
	if err := copyTree(tmpl, dataDir, nil); err != nil {
		return fmt.Errorf("copy of the data directory template %s: %w", tmpl, err)
	}
	return newSystemIdentifier(dataDir)
}

// dataTemplate returns the template of binDir, running initdb for it once. The directory's name
// holds what identifies the binaries (their path, the postgres binary's size and time), so a
// replaced installation gets a new template.
func dataTemplate(binDir string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	fi, err := os.Stat(filepath.Join(binDir, "postgres"))
	if err != nil {
		return "", err
	}
	key := crc32.ChecksumIEEE([]byte(fmt.Sprintf("%s|%d|%d|%s", binDir, fi.Size(), fi.ModTime().UnixNano(), strings.Join(initdbArgs, " "))))
	base := filepath.Join(RepoRoot(), ".cache", "pg-template")
	dir := filepath.Join(base, fmt.Sprintf("%08x", key))
	if _, err := os.Stat(filepath.Join(dir, "global", "pg_control")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(base, "initdb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	if cred, _, _ := serviceUser(); cred != nil {
		if err := os.Chown(work, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	initdb, err := command(filepath.Join(binDir, "initdb"), append([]string{"-D", filepath.Join(work, "data")}, initdbArgs...)...)
	if err != nil {
		return "", err
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// another process may have made it meanwhile: keep the first
	if err := os.Rename(filepath.Join(work, "data"), dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "global", "pg_control")); statErr != nil {
			return "", err
		}
	}
	return dir, nil
}

// newSystemIdentifier gives the data directory a random system identifier: the first field of
// pg_control (whose CRC-32C, over the fields before it, is written again) and of the long header
// that starts each WAL segment (at byte 24, after the short page header).
func newSystemIdentifier(dataDir string) error {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	// below 2^63 and never 0, as initdb's (seconds << 32 | ...): pg_control_system() shows it as a
	// bigint, the replication protocol as unsigned
	id[7] = id[7]&0x7f | 0x01
	control := filepath.Join(dataDir, "global", "pg_control")
	b, err := os.ReadFile(control)
	if err != nil {
		return err
	}
	at := controlCRCOffset(b)
	if at < 0 {
		return errors.New("pg_control: its CRC was not found")
	}
	copy(b[:8], id[:])
	binary.LittleEndian.PutUint32(b[at:], crc32.Checksum(b[:at], castagnoli))
	if err := os.WriteFile(control, b, 0o600); err != nil {
		return err
	}
	segments, err := filepath.Glob(filepath.Join(dataDir, "pg_wal", strings.Repeat("[0-9A-F]", 24)))
	if err != nil {
		return err
	}
	for _, seg := range segments {
		if err := patchSegment(seg, id[:]); err != nil {
			return fmt.Errorf("%s: %w", seg, err)
		}
	}
	return nil
}

// castagnoli is the CRC-32C table of PostgreSQL's pg_control checksum.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// controlCRCOffset finds pg_control's CRC: the last field of the control data, a CRC-32C of
// every byte before it (its offset depends on the version). -1 if none matches.
func controlCRCOffset(b []byte) int {
	for at := 16; at+4 <= len(b) && at <= 1024; at += 4 {
		if crc32.Checksum(b[:at], castagnoli) == binary.LittleEndian.Uint32(b[at:]) {
			return at
		}
	}
	return -1
}

// patchSegment writes id into the long page header at the start of a WAL segment.
func patchSegment(path string, id []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var head [32]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return err
	}
	const xlpLongHeader = 0x0002
	if binary.LittleEndian.Uint16(head[2:])&xlpLongHeader == 0 {
		return errors.New("no long page header at its start")
	}
	if _, err := f.WriteAt(id, 24); err != nil {
		return err
	}
	return f.Close()
}
