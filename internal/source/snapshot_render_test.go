package source

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/snapshot"
)

// TestRowRenderFinish checks that rows rendered as they arrive and completed at the high watermark
// (rowRender.finish) are the events rendering the chunk afterwards makes, for each partitioning and
// with seq numbers of one to three digits, and that finish writes each event in place, exactly
// sized: an event's bytes follow the previous one's in the arena, but where a block ends.
func TestRowRenderFinish(t *testing.T) {
	reg := convert.NewRegistry()
	cols := []event.Column{{Name: "id", Type: reg.Lookup(20)}, {Name: "v", Type: reg.Lookup(25)}, {Name: "n", Type: reg.Lookup(1700)}}
	cases := []struct {
		name string
		part []int
	}{{"single", nil}, {"by key", []int{0}}, {"by columns", []int{1, 2}}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab := &snapTable{info: &TableInfo{Table: Table{Schema: "public", Name: "t", Queue: "q"}}, full: "public.t",
				enc: event.NewTable("public.t", cols, []int{0}, c.part)}
			ch := &snapshot.Chunk{ReadAt: time.Date(2026, 12, 1, 4, 0, 0, 123000000, time.UTC)}
			for i := range 1200 {
				row := [][]byte{[]byte(fmt.Sprint(i)), []byte(fmt.Sprintf("v \"%d\" é\n", i)), []byte(fmt.Sprint(i * 3))}
				if i%7 == 0 {
					row[1] = nil
				}
				ch.Rows.Append(row)
			}
			sn := &snapshotter{epoch: "e"}
			r := &rowRender{}
			r.reset(tab)
			for _, row := range ch.Rows.All() {
				r.add(row)
			}
			const hw = 0x16B3748
			got, gotSize := r.finish(sn.tx(hw), sn.position(hw, ch), ch.ReadAt.UnixMilli())
			want, wantSize := sn.render(&pendingChunk{table: tab, chunk: ch}, hw)
			if !reflect.DeepEqual(got, want) || gotSize != wantSize {
				t.Fatalf("finish and render differ (sizes %d, %d):\n%+v\n%+v", gotSize, wantSize, got[:2], want[:2])
			}
			gaps := 0
			for i := 1; i < len(got); i++ {
				prev := &got[i-1]
				end := len(prev.Payload) + len(prev.ID)
				if c.part != nil {
					end += len(prev.Partition)
				}
				if unsafe.SliceData(got[i].Payload) != (*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(prev.Payload)), end)) {
					gaps++
				}
			}
			if blocks := gotSize/arenaBlock + 1; gaps > blocks {
				t.Fatalf("%d events not right after the previous one in the arena (%d blocks)", gaps, blocks)
			}
		})
	}
}

// TestRetailIsARenderAtTheNewLSN: a chunk's events rendered for its high watermark and given
// another lsn (retail, an early chunk) are what rendering the chunk for that lsn makes, for each
// partitioning, also when the new lsn's text is shorter or longer than the old one's.
func TestRetailIsARenderAtTheNewLSN(t *testing.T) {
	reg := convert.NewRegistry()
	cols := []event.Column{{Name: "id", Type: reg.Lookup(20)}, {Name: "v", Type: reg.Lookup(25)}}
	for _, part := range [][]int{nil, {0}, {1}} {
		for _, to := range []uint64{0x16B3749, 0x1, 0x1A_0000_0000} {
			tab := &snapTable{info: &TableInfo{Table: Table{Schema: "public", Name: "t", Queue: "q"}}, full: "public.t",
				enc: event.NewTable("public.t", cols, []int{0}, part)}
			ch := &snapshot.Chunk{ReadAt: time.Date(2026, 12, 6, 6, 0, 0, 0, time.UTC)}
			for i := range 150 {
				ch.Rows.Append([][]byte{[]byte(fmt.Sprint(i)), []byte(fmt.Sprintf("v%d", i))})
			}
			sn := &snapshotter{epoch: "e"}
			const hw = 0x16B3748
			p := &pendingChunk{table: tab, chunk: ch}
			events, _ := sn.render(p, hw)
			p.wentEarly, p.wentAt = true, pglogrepl.LSN(to)
			got := sn.retail(p, slices.Clone(events), hw, p.lsn(hw))
			want, _ := sn.render(p, hw) // lsn: wentAt
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("part %v, lsn %X: retail and render differ:\n%+v\n%+v", part, to, got[:2], want[:2])
			}
		}
	}
}
