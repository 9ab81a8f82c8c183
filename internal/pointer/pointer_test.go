package pointer

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

func TestPositionsSortLikeTheStreamAndRoundTrip(t *testing.T) {
	base := New(1, "0a1b2c3d", "7300000000000000001", "pgrelay_x", 0x1570EA0)
	// In stream order: a complete txn, pieces of the next one, its end, an idle advance, a resync.
	ordered := []Pointer{
		base,
		base.InsideTxn(0x1580000, 0),
		base.InsideTxn(0x1580000, 500),
		base.InsideTxn(0x1580000, 1000),
		base.AtCommit(0x1580000),
		base.AtCommit(0x1_0000_0000),
		func() Pointer { p := base.AtCommit(0x10); p.Gen = 2; return p }(),
	}
	var positions []string
	for i, p := range ordered {
		positions = append(positions, p.Position())
		if i > 0 && !ordered[i-1].Less(p) {
			t.Errorf("%d: %s not after %s", i, p.Position(), ordered[i-1].Position())
		}
		got, err := Parse(p.Marshal(time.Unix(0, 0)))
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if got.Position() != p.Position() || got.Epoch != p.Epoch || got.SystemID != p.SystemID {
			t.Errorf("%d: round trip %+v != %+v", i, got, p)
		}
	}
	if !sort.StringsAreSorted(positions) {
		t.Errorf("positions do not sort: %v", positions)
	}
	if want := "00000001/0000000001580000/00000000000001f4/0000000000000000"; positions[2] != want {
		t.Errorf("pos = %s, want %s", positions[2], want)
	}
}

func TestMarshalFieldOrderAndNullSnapshot(t *testing.T) {
	p := New(1, "0a1b2c3d", "42", "s", 0x1570EA0).InsideTxn(0x1580000, 3)
	got := string(p.Marshal(time.Date(2026, 10, 3, 6, 15, 3, 583036000, time.UTC)))
	want := `{"v":1,"epoch":"0a1b2c3d","system_id":"42","slot":"s","lsn":"0/1570EA0",` +
		`"in_txn":{"commit_lsn":"0/1580000","done":3},"snapshot":null,` +
		`"updated_at":"2026-10-03T06:15:03.583036Z","pos":"00000001/0000000001580000/0000000000000003/0000000000000000"}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestCovered(t *testing.T) {
	p := New(1, "e", "s", "x", 100).InsideTxn(200, 5)
	for _, c := range []struct {
		commit pglogrepl.LSN
		seq    uint64
		want   bool
	}{{99, 0, true}, {100, 9, true}, {200, 4, true}, {200, 5, false}, {201, 0, false}, {150, 0, false}} {
		if got := p.Covered(c.commit, c.seq); got != c.want {
			t.Errorf("Covered(%d,%d) = %v", c.commit, c.seq, got)
		}
	}
}

func TestParseRefusesCorruptPointers(t *testing.T) {
	for _, in := range []string{`nope`, `{"v":2}`, `{"v":1,"epoch":"e","lsn":"zz","pos":"x"}`,
		`{"v":1,"epoch":"e","lsn":"0/10","pos":"00000001/0000000000000011/ffffffffffffffff/0000000000000000"}`} {
		if _, err := Parse([]byte(in)); !errcode.Is(err, errcode.PointerCorrupt) {
			t.Errorf("%s: %v", in, err)
		}
	}
}

func TestMessageIDs(t *testing.T) {
	if got := MessageID("0a1b2c3d", 0x1570EA0, 7, 0); got != "pg:0a1b2c3d:0000000001570EA0:7" {
		t.Error(got)
	}
	if got := MessageID("0a1b2c3d", 0x1570EA0, 7, 1); got != "pg:0a1b2c3d:0000000001570EA0:7.1" {
		t.Error(got)
	}
	if got := TxID("0a1b2c3d", 0x1570EA0); got != "pg:0a1b2c3d:0000000001570EA0" {
		t.Error(got)
	}
	if e := NewEpoch(); len(e) != 8 {
		t.Error(e)
	}
}

func TestParseLSN(t *testing.T) {
	for _, s := range []string{"0/0", "0/1570EA0", "16/B374D848", "FFFFFFFF/FFFFFFFF"} {
		want, _ := pglogrepl.ParseLSN(s)
		got, err := ParseLSN(s)
		if err != nil || got != want || got.String() != s || FormatLSN(got) != s {
			t.Errorf("%s: %v %v", s, got, err)
		}
	}
	for _, l := range []pglogrepl.LSN{1, 0xF, 0x10, 0xFFFFFFFF, 1 << 32, 0x10_0000_0000, 0xF_0000_000F, 0x123456789ABCDEF0} {
		if got, want := FormatLSN(l), l.String(); got != want {
			t.Errorf("FormatLSN(%d) = %s, want %s", uint64(l), got, want)
		}
	}
	for _, s := range []string{"", "1", "x/1", "1/", "100000000/0"} {
		if _, err := ParseLSN(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

func TestEnvelopePartsRoundTrip(t *testing.T) {
	p := New(1, "0a1b2c3d", "42", "s", 0x1570EA0).InsideTxn(0x1580000, 7).WithParts(map[string]uint64{"ledger": 3, "audit": 1})
	b := p.Marshal(time.Unix(0, 0))
	if want := `"in_txn":{"commit_lsn":"0/1580000","done":7,"parts":{"audit":1,"ledger":3}}`; !strings.Contains(string(b), want) {
		t.Errorf("%s lacks %s", b, want)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if parts := got.Parts(0x1580000); parts["ledger"] != 3 || parts["audit"] != 1 || len(parts) != 2 {
		t.Errorf("parts %v", parts)
	}
	if got.Parts(0x1590000) != nil || New(1, "e", "s", "x", 1).Parts(0x1580000) != nil {
		t.Error("parts of another transaction")
	}
	if got.Position() != p.Position() {
		t.Errorf("pos %s != %s", got.Position(), p.Position())
	}
	// Without parts the field is left out, as in pointers written before it existed.
	if b := New(1, "e", "s", "x", 1).InsideTxn(2, 1).Marshal(time.Unix(0, 0)); strings.Contains(string(b), "parts") {
		t.Errorf("%s", b)
	}
	if id := EnvelopeID("pg:0a1b2c3d:0000000001570EA0", 2); id != "pg:0a1b2c3d:0000000001570EA0:t2" {
		t.Error(id)
	}
}

// TestPositionText: pos is gen, LSN (or the commit LSN inside a transaction), changes done and
// snapshot chunks as zero-padded lower-case hex, the text fmt's %08x/%016x/%016x/%016x prints.
func TestPositionText(t *testing.T) {
	for _, p := range []Pointer{
		{Gen: 1, LSN: "0/0"},
		{Gen: 0xffffffff, LSN: "FFFFFFFF/FFFFFFFF", SnapshotChunks: ^uint64(0)},
		{Gen: 7, LSN: "16/B374D848", InTxn: &InTxn{CommitLSN: "16/B3750000", Done: 12}, SnapshotChunks: 0xabc},
	} {
		l, i := uint64(p.LSNValue()), Complete
		if p.InTxn != nil {
			l, i = uint64(p.CommitValue()), p.InTxn.Done
		}
		if got, want := p.Position(), fmt.Sprintf("%08x/%016x/%016x/%016x", p.Gen, l, i, p.SnapshotChunks); got != want {
			t.Errorf("Position() = %s, want %s", got, want)
		}
	}
}

// Marshal writes the bytes encoding/json writes, by hand or not, for pointers of every shape; a
// pointer without a snapshot cursor is written by hand whether made here or read back.
func TestMarshalIsEncodingJSONs(t *testing.T) {
	base := New(3, "0a1b2c3d", "7412345678901234567", "pgrelay_pub", 0x16B3748)
	now := time.Date(2026, 12, 1, 6, 15, 3, 583036000, time.FixedZone("x", 3600))
	with := func(f func(p *Pointer)) Pointer { p := base; f(&p); return p }
	for _, c := range []struct {
		name  string
		p     Pointer
		plain bool // written by hand
	}{
		{"fresh", base, true},
		{"tables", with(func(p *Pointer) { p.Tables = []string{"public.a", "s.b c"} }), true},
		{"no tables (empty, left out)", with(func(p *Pointer) { p.Tables = []string{} }), true},
		{"inside a transaction", base.InsideTxn(0x16B3800, 7), true},
		{"with parts", base.InsideTxn(0x16B3800, 7).WithParts(map[string]uint64{"zq": 2, "aq": 1, "m": 0}), true},
		{"empty parts (left out)", base.InsideTxn(0x16B3800, 7).WithParts(map[string]uint64{}), true},
		{"snapshot cursor", with(func(p *Pointer) { p.Snapshot = json.RawMessage(`{"table": "public.a", "after": [1, "<x>"]}`) }), false},
		{"a table name encoding/json escapes", with(func(p *Pointer) { p.Tables = []string{`public."we<ird>"`, "s.é"} }), false},
		{"a queue name with an ampersand", base.InsideTxn(1, 1).WithParts(map[string]uint64{"a&b": 1}), false},
		{"read back from the queue (its null snapshot)", parsed(t, base.Marshal(now)), true},
		{"the largest values", with(func(p *Pointer) {
			p.Gen, p.SnapshotChunks, p.V = ^uint32(0), ^uint64(0), -1
			*p = p.InsideTxn(^pglogrepl.LSN(0), ^uint64(0)-1)
		}), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.p.Marshal(now)
			want := c.p
			want.UpdatedAt, want.Pos = now.UTC().Format("2006-01-02T15:04:05.000000Z"), c.p.Position()
			if w := want.marshalReflect(); string(got) != string(w) {
				t.Fatalf("Marshal\n%s\nencoding/json\n%s", got, w)
			}
			if _, ok := want.appendPlain(nil); ok != c.plain {
				t.Fatalf("written by hand: %v, want %v", ok, c.plain)
			}
		})
	}
}

func parsed(t *testing.T, b []byte) Pointer {
	t.Helper()
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func BenchmarkMarshal(b *testing.B) {
	p := New(1, "0a1b2c3d", "7412345678901234567", "pgrelay_pub", 0x16B3748)
	p.Tables = []string{"public.orders"}
	now := time.Now()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = p.Marshal(now)
	}
}
