// Package pointer is the source's position in the queue (DESIGN §3, docs/batch-contract.md): the
// pointer JSON stored in Redis, its totally ordered `pos` string, and the message ids derived from
// positions. The pointer moves only inside the atomic write of the messages it covers.
//
// Meaning of a pointer: every source transaction whose commit LSN is at or below `lsn` is in the
// queue; with `in_txn`, so are the first `done` changes (by seq) of the transaction committing at
// `in_txn.commit_lsn`. An idle advance to a WAL position W (keepalive) stores W-1, so a commit
// record starting exactly at W is still read.
package pointer

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Version is the pointer format version (`v`).
const Version = 1

// Complete is the in-transaction index of a complete transaction in `pos`.
const Complete = ^uint64(0)

// InTxn records how far into one transaction a split transaction's pieces got.
type InTxn struct {
	CommitLSN string `json:"commit_lsn"`
	Done      uint64 `json:"done"` // changes with seq < Done are in the queue
	// Parts counts, per enveloped queue, the envelope parts of the transaction already in the
	// queue, so a restart numbers the next part on; absent when there are none.
	Parts map[string]uint64 `json:"parts,omitempty"`
}

// Pointer is the JSON document stored under the source's `...:ptr` key.
type Pointer struct {
	V        int             `json:"v"`
	Epoch    string          `json:"epoch"`
	SystemID string          `json:"system_id"`
	Slot     string          `json:"slot"`
	LSN      string          `json:"lsn"`
	InTxn    *InTxn          `json:"in_txn"`
	Snapshot json.RawMessage `json:"snapshot"` // the snapshot's cursor; null when none runs
	// Tables are the configured tables ("schema.name") as of this pointer: a table configured
	// later is missing here, so the next start knows to snapshot it. Absent (nil) in pointers
	// written before the field existed: then every configured table counts as known.
	Tables    []string `json:"tables,omitempty"`
	UpdatedAt string   `json:"updated_at"`
	Pos       string   `json:"pos"`

	// Gen is the epoch generation (1 on the first start, +1 per resync); it travels inside Pos.
	Gen uint32 `json:"-"`
	// SnapshotChunks counts the snapshot chunks completed in this epoch; it travels inside Pos.
	SnapshotChunks uint64 `json:"-"`
}

// New returns the first pointer of a fresh epoch at lsn.
func New(gen uint32, epoch, systemID, slot string, lsn pglogrepl.LSN) Pointer {
	return Pointer{V: Version, Gen: gen, Epoch: epoch, SystemID: systemID, Slot: slot, LSN: lsn.String()}
}

// NewEpoch returns 8 random lower-case hex digits.
func NewEpoch() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// LSNValue parses the pointer's `lsn`.
func (p Pointer) LSNValue() pglogrepl.LSN {
	l, _ := ParseLSN(p.LSN)
	return l
}

// ParseLSN parses PostgreSQL's "X/X" LSN text (without fmt.Sscanf, which is slow on hot paths).
func ParseLSN(s string) (pglogrepl.LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("lsn %q: want X/X", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("lsn %q: want X/X", s)
	}
	return pglogrepl.LSN(h<<32 | l), nil
}

// CommitValue parses in_txn.commit_lsn (0 without in_txn).
func (p Pointer) CommitValue() pglogrepl.LSN {
	if p.InTxn == nil {
		return 0
	}
	l, _ := ParseLSN(p.InTxn.CommitLSN)
	return l
}

// Position returns the sortable position string (docs/batch-contract.md):
// GGGGGGGG/LLLLLLLLLLLLLLLL/IIIIIIIIIIIIIIII/SSSSSSSSSSSSSSSS.
func (p Pointer) Position() string {
	l, i := uint64(p.LSNValue()), Complete
	if p.InTxn != nil {
		l, i = uint64(p.CommitValue()), p.InTxn.Done
	}
	b := make([]byte, 0, 8+3*17)
	b = appendHex(b, uint64(p.Gen), 8)
	b = appendHex(append(b, '/'), l, 16)
	b = appendHex(append(b, '/'), i, 16)
	b = appendHex(append(b, '/'), p.SnapshotChunks, 16)
	return string(b)
}

// appendHex appends v as width lower-case hex digits (zero-padded; v must fit), what
// fmt's %0<width>x prints, without fmt: Position runs several times per batch.
func appendHex(b []byte, v uint64, width int) []byte {
	const digits = "0123456789abcdef"
	n := len(b)
	b = append(b, make([]byte, width)...)
	for i := len(b) - 1; i >= n; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	return b
}

// SnapshotRuns reports whether p carries a snapshot cursor: a pointer read back keeps JSON null in
// Snapshot when none runs, one made here has nil.
func (p Pointer) SnapshotRuns() bool {
	return len(p.Snapshot) > 0 && string(p.Snapshot) != "null"
}

// Covered reports whether change seq of the transaction committing at commit is already in.
func (p Pointer) Covered(commit pglogrepl.LSN, seq uint64) bool {
	if commit <= p.LSNValue() {
		return true
	}
	return p.InTxn != nil && commit == p.CommitValue() && seq < p.InTxn.Done
}

// AtCommit returns p moved past the whole transaction committing at commit.
func (p Pointer) AtCommit(commit pglogrepl.LSN) Pointer {
	p.LSN, p.InTxn = FormatLSN(commit), nil
	return p
}

// InsideTxn returns p moved to the first done changes of the transaction committing at commit.
func (p Pointer) InsideTxn(commit pglogrepl.LSN, done uint64) Pointer {
	p.InTxn = &InTxn{CommitLSN: FormatLSN(commit), Done: done}
	return p
}

// WithParts returns p (inside a transaction) recording parts, the envelope parts of the
// transaction in the queue by queue.
func (p Pointer) WithParts(parts map[string]uint64) Pointer {
	if p.InTxn != nil {
		in := *p.InTxn
		in.Parts = parts
		p.InTxn = &in
	}
	return p
}

// Parts returns how many envelope parts of the transaction committing at commit are in the queue,
// by queue (nil when none, or when p is not inside that transaction).
func (p Pointer) Parts(commit pglogrepl.LSN) map[string]uint64 {
	if p.InTxn == nil || p.CommitValue() != commit {
		return nil
	}
	return p.InTxn.Parts
}

// EnvelopeID is the stable id of part (1, 2, ...) of the envelope of the transaction (or chunk)
// whose id is tx: `<tx>:t<part>`.
func EnvelopeID(tx string, part uint64) string { return string(AppendEnvelopeID(nil, tx, part)) }

// AppendEnvelopeID appends EnvelopeID(tx, part) to dst.
func AppendEnvelopeID(dst []byte, tx string, part uint64) []byte {
	dst = append(dst, tx...)
	dst = append(dst, ":t"...)
	return strconv.AppendUint(dst, part, 10)
}

// Less reports whether p is strictly before q.
func (p Pointer) Less(q Pointer) bool { return p.Position() < q.Position() }

// Marshal returns the JSON stored in Redis, with updated_at and pos filled in.
//
// A streaming source marshals a pointer per batch, and through encoding/json's reflection that
// cost as much as the rest of a small batch's cover; so a pointer with no snapshot cursor and only
// plain strings (printable ASCII that encoding/json writes as it is) is written by hand, the same
// bytes. Any other goes through encoding/json.
func (p Pointer) Marshal(now time.Time) []byte {
	p.UpdatedAt = event.FormatTime(now)
	p.Pos = p.Position()
	if b, ok := p.appendPlain(make([]byte, 0, 384)); ok {
		return b
	}
	return p.marshalReflect()
}

// marshalReflect is Marshal's encoding through encoding/json.
func (p Pointer) marshalReflect() []byte {
	if p.Snapshot == nil {
		p.Snapshot = json.RawMessage("null")
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a Pointer always marshals
	}
	return b
}

// appendPlain appends p's JSON as encoding/json writes it (fields in order, parts' keys sorted,
// empty tables and parts left out); ok is false, and the JSON left to encoding/json, when p has
// a snapshot cursor (SnapshotRuns) or a string that is not plain.
func (p Pointer) appendPlain(b []byte) (_ []byte, ok bool) {
	if p.SnapshotRuns() || !plain(p.Epoch, p.SystemID, p.Slot, p.LSN, p.UpdatedAt, p.Pos) || !plain(p.Tables...) {
		return b, false
	}
	var keys []string
	if p.InTxn != nil {
		if !plain(p.InTxn.CommitLSN) {
			return b, false
		}
		for k := range p.InTxn.Parts {
			if !plain(k) {
				return b, false
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
	}
	field := func(b []byte, key string) []byte { return append(append(append(b, ',', '"'), key...), '"', ':') }
	text := func(b []byte, key, v string) []byte { return append(append(append(field(b, key), '"'), v...), '"') }
	b = strconv.AppendInt(append(b, `{"v":`...), int64(p.V), 10)
	b = text(text(text(text(b, "epoch", p.Epoch), "system_id", p.SystemID), "slot", p.Slot), "lsn", p.LSN)
	b = field(b, "in_txn")
	if p.InTxn == nil {
		b = append(b, "null"...)
	} else {
		b = append(append(append(b, `{"commit_lsn":"`...), p.InTxn.CommitLSN...), '"')
		b = strconv.AppendUint(field(b, "done"), p.InTxn.Done, 10)
		if len(keys) > 0 {
			b = append(field(b, "parts"), '{')
			for i, k := range keys {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendUint(append(append(append(b, '"'), k...), '"', ':'), p.InTxn.Parts[k], 10)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	b = append(field(b, "snapshot"), "null"...)
	if len(p.Tables) > 0 {
		b = append(field(b, "tables"), '[')
		for i, t := range p.Tables {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(append(append(b, '"'), t...), '"')
		}
		b = append(b, ']')
	}
	b = text(text(b, "updated_at", p.UpdatedAt), "pos", p.Pos)
	return append(b, '}'), true
}

// plain reports whether encoding/json writes every one of ss between its quotes as it is:
// printable ASCII but '"', '\\' and the HTML characters it escapes ('<', '>', '&').
func plain(ss ...string) bool {
	for _, s := range ss {
		for i := 0; i < len(s); i++ {
			if !plainByte[s[i]] {
				return false
			}
		}
	}
	return true
}

// plainByte says which bytes plain allows.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c <= 0x7e; c++ {
		t[c] = !strings.ContainsRune(`"\<>&`, rune(c))
	}
	return t
}()

// Parse reads a stored pointer; anything unreadable is the coded error pointer_corrupt.
func Parse(b []byte) (Pointer, error) {
	var p Pointer
	corrupt := func(why string) (Pointer, error) {
		return Pointer{}, errcode.New(errcode.PointerCorrupt, "the stored pointer is unreadable ("+why+")",
			"inspect it with `pgrelay status`; if the queue was written by an incompatible version, run `pgrelay resync`")
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return corrupt(err.Error())
	}
	if p.V != Version {
		return corrupt("version " + strconv.Itoa(p.V))
	}
	if _, err := ParseLSN(p.LSN); err != nil || p.Epoch == "" {
		return corrupt("lsn or epoch")
	}
	parts := strings.Split(p.Pos, "/")
	if len(parts) != 4 {
		return corrupt("pos")
	}
	g, err1 := strconv.ParseUint(parts[0], 16, 32)
	s, err2 := strconv.ParseUint(parts[3], 16, 64)
	if err1 != nil || err2 != nil {
		return corrupt("pos")
	}
	p.Gen, p.SnapshotChunks = uint32(g), s
	if p.InTxn != nil {
		if _, err := ParseLSN(p.InTxn.CommitLSN); err != nil {
			return corrupt("in_txn")
		}
	}
	if p.Position() != p.Pos {
		return corrupt("pos does not match the fields")
	}
	return p, nil
}

const hexDigits = "0123456789ABCDEF"

// FormatLSN prints an LSN as PostgreSQL does ("16/B374D848": upper-case hex halves without
// leading zeros), the same text as pglogrepl's LSN.String, which formats through fmt: this runs
// for every transaction.
func FormatLSN(l pglogrepl.LSN) string {
	var b [17]byte
	i := len(b)
	for lo := uint32(l); ; lo >>= 4 {
		i--
		b[i] = hexDigits[lo&0xf]
		if lo < 16 {
			break
		}
	}
	i--
	b[i] = '/'
	for hi := uint32(l >> 32); ; hi >>= 4 {
		i--
		b[i] = hexDigits[hi&0xf]
		if hi < 16 {
			break
		}
	}
	return string(b[i:])
}

// hex16 prints an LSN as 16 upper-case hex digits.
func hex16(l pglogrepl.LSN) string {
	const digits = hexDigits
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[l&0xf]
		l >>= 4
	}
	return string(b[:])
}

// TxID is the id shared by the messages of one source transaction: `pg:<epoch>:<commit LSN hex16>`.
func TxID(epoch string, commit pglogrepl.LSN) string {
	return "pg:" + epoch + ":" + hex16(commit)
}

// MessageID is the stable id of the k-th event (k ≥ 0) of change seq: `pg:<epoch>:<LSN>:<seq>[.k]`.
func MessageID(epoch string, commit pglogrepl.LSN, seq uint64, k int) string {
	id := TxID(epoch, commit) + ":" + strconv.FormatUint(seq, 10)
	if k > 0 {
		id += "." + strconv.Itoa(k)
	}
	return id
}
