package queue

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/testenv"
)

// The script refuses a queue whose keys do not follow the layout (a meta offset that is not a
// number, a shard key that is not a stream) before it writes anything, with the transaction's
// verdict (layout_version); it used to XADD the messages before the bad shard's and then fail,
// leaving entries without their meta offsets (the next write repeats them) and, for the key of
// another type, a moved pointer over missing entries.
func TestWriteScriptChecksLayoutBeforeWriting(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	l := NewLayout("")
	corruptions := []struct {
		name string
		f    func(q string, shard int)
	}{
		{"meta offset not a number", func(q string, shard int) { rdb.HSet(ctx, l.Meta(q), fmt.Sprintf("off:%d", shard), "x") }},
		{"meta offset negative", func(q string, shard int) { rdb.HSet(ctx, l.Meta(q), fmt.Sprintf("off:%d", shard), "-3") }},
		{"shard key not a stream", func(q string, shard int) { rdb.Del(ctx, l.Stream(q, shard)); rdb.Set(ctx, l.Stream(q, shard), "x", 0) }},
	}
	for i, c := range corruptions {
		for _, script := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/script=%v", c.name, script), func(t *testing.T) {
				q := fmt.Sprintf("corrupt%d-%v", i, script)
				_, ptrKey, cover := leasedSource(t, rdb, q)
				w := NewWriter(rdb, WriterConfig{Shards: 4})
				defer w.Close()
				w.scriptOnly = script
				if _, err := w.Write(ctx, batchOf(q, "first", 20, 6), cover("0001")); err != nil {
					t.Fatal(err)
				}
				second := batchOf(q, "second", 30, 6)
				bad := Shard(second[5].Partition, 4) // the shard of the partition that appears last
				if Shard(second[0].Partition, 4) == bad {
					t.Fatal("pick other partitions: the first message must go to another shard")
				}
				c.f(q, bad)
				lens := func() map[int]int64 {
					m := map[int]int64{}
					for n := range 4 {
						if n != bad {
							m[n] = rdb.XLen(ctx, l.Stream(q, n)).Val()
						}
					}
					return m
				}
				lensBefore, metaBefore := lens(), rdb.HGetAll(ctx, l.Meta(q)).Val()
				_, err := w.Write(ctx, second, cover("0003"))
				if errcode.Of(err) != errcode.LayoutVersion {
					t.Errorf("err %v, want code %s", err, errcode.LayoutVersion)
				}
				if got := lens(); !maps.Equal(got, lensBefore) {
					t.Errorf("stream lengths %v, before the write %v: written in part", got, lensBefore)
				}
				if got := rdb.HGetAll(ctx, l.Meta(q)).Val(); !maps.Equal(got, metaBefore) {
					t.Errorf("meta %v, before the write %v", got, metaBefore)
				}
				if got := rdb.Get(ctx, ptrKey).Val(); got != `{"pos":"0001"}` {
					t.Errorf("pointer %s, want pos 0001", got)
				}
			})
		}
	}
}

// The transaction and the script give the same verdict for the same state: a fenced cover
// whose pos comes without a pointer key (pgrelay_cover without pgrelay_pointer_key) is a fenced
// write that moves no pointer, and an empty stored pointer is not JSON with a pos (the script
// refused the first with pgrelay_bad_args, the transaction wrote over the second as if there
// were no pointer).
func TestWriteTxAndScriptAgree(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client()
	ctx := context.Background()
	cases := []struct {
		name  string
		cover func(c *Cover) *Cover
		setup func(ptrKey string)
		code  errcode.Code // "": written
		dup   bool
	}{
		{name: "pos without a pointer key", cover: func(c *Cover) *Cover {
			c.PointerKey = ""
			return c
		}},
		{name: "empty stored pointer", setup: func(ptrKey string) { rdb.Set(ctx, ptrKey, "", 0) }, code: errcode.PointerCorrupt},
		{name: "stored pointer with a Pos member", setup: func(ptrKey string) { rdb.Set(ctx, ptrKey, `{"Pos":"0001"}`, 0) }},
		{name: "stored pointer Pos at the cover", setup: func(ptrKey string) { rdb.Set(ctx, ptrKey, `{"POS":"0003"}`, 0) }, dup: true},
	}
	for i, c := range cases {
		for _, script := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/script=%v", c.name, script), func(t *testing.T) {
				q := fmt.Sprintf("agree%d-%v", i, script)
				_, ptrKey, cover := leasedSource(t, rdb, q)
				w := NewWriter(rdb, WriterConfig{Shards: 4})
				defer w.Close()
				w.scriptOnly = script
				if c.setup != nil {
					c.setup(ptrKey)
				}
				cv := cover("0003")
				if c.cover != nil {
					cv = c.cover(cv)
				}
				b := batchOf(q, "b", 10, 3)
				res, err := w.Write(ctx, b, cv)
				switch {
				case c.code != "":
					if errcode.Of(err) != c.code {
						t.Fatalf("%v %v, want code %s", res, err, c.code)
					}
					if n := rdb.Exists(ctx, NewLayout("").Meta(q)).Val(); n != 0 {
						t.Fatal("written")
					}
				case c.dup:
					if err != nil || res != ResultDuplicate {
						t.Fatalf("%v %v, want duplicate", res, err)
					}
				case err != nil || res != ResultOK:
					t.Fatalf("%v %v, want ok", res, err)
				default:
					checkQueue(t, rdb, w.Layout(), q, b)
				}
			})
		}
	}
}
