package queue

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// The layout versions of a queue (its meta hash's `version`, DESIGN §4). The version is fixed
// when the queue is created and says how its entries hold a message:
//
//   - 1: seven fields, `off`, `p`, `id`, `tx`, `ts`, `h`, `d`;
//   - 2: two fields, `m` (one JSON object holding off, p, id, tx, ts and, when present, h) and `d`.
//
// Redis' cost per entry grows with its fields (each is parsed, stored and appended to the AOF
// again), so version 2 costs it about a third less per entry. Queues are created with
// LayoutVersion unless the writer is told otherwise (WriterConfig.CreateVersion, the output's
// layout_version); a queue of version 1 keeps its layout: pgrelay writes and reads both.
const (
	LayoutV1 = 1
	LayoutV2 = 2
	// LayoutVersion is the version of the queues this code creates.
	LayoutVersion = LayoutV2
)

// layoutOf is the layout version whose text is v (the meta's `version`), 0 for one this code
// neither reads nor writes.
func layoutOf(v string) int {
	for _, n := range []int{LayoutV1, LayoutV2} {
		if v == strconv.Itoa(n) {
			return n
		}
	}
	return 0
}

// readable checks that a reader of this code can read queue q, whose meta's `version` is v ("":
// none, a queue the first layout's producers created): a layout_version error for a version it
// does not know (a queue a later pgrelay created: its entries would be read with their fields
// missing, and their offsets as 0).
func readable(q, v string) error {
	if v == "" || layoutOf(v) != 0 {
		return nil
	}
	return errcode.New(errcode.LayoutVersion,
		fmt.Sprintf("queue %q has layout version %s; this pgrelay reads versions %d and %d", q, v, LayoutV1, LayoutV2),
		"upgrade this pgrelay to a version that reads the layout (consumers and tools before writers)")
}

// The entry fields (DESIGN §4).
const (
	FieldOffset    = "off" // version 1: the per-shard offset
	FieldPartition = "p"   // version 1: the partition
	FieldID        = "id"  // version 1: the message id
	FieldTx        = "tx"  // version 1: the transaction id
	FieldCreated   = "ts"  // version 1: created-at, Unix ms
	FieldHeader    = "h"   // version 1: the metadata JSON ("" when absent)
	FieldMeta      = "m"   // version 2: every field above in one JSON object, h only when present
	FieldPayload   = "d"   // both: the payload bytes
)

// EntryOf decodes a stream entry of either layout version: an entry with an `m` field is read as
// version 2, any other as version 1. Fields a foreign producer left out (or an `m` that is not the
// object DESIGN §4 gives) stay zero, as a missing version-1 field does.
func EntryOf(m redis.XMessage) Entry {
	str := func(k string) string {
		s, _ := m.Values[k].(string)
		return s
	}
	e := Entry{ID: m.ID, Payload: []byte(str(FieldPayload))}
	if meta, ok := m.Values[FieldMeta].(string); ok {
		decodeMeta(&e, meta)
		return e
	}
	e.Partition, e.MessageID, e.Tx, e.Header = str(FieldPartition), str(FieldID), str(FieldTx), []byte(str(FieldHeader))
	e.Offset, _ = strconv.ParseInt(str(FieldOffset), 10, 64)
	e.CreatedMs, _ = strconv.ParseInt(str(FieldCreated), 10, 64)
	return e
}

// decodeMeta fills dst from a version-2 `m` object; a member of the wrong type leaves what it
// would have given zero, and an object that does not parse leaves dst as it was. Strings without
// escapes are substrings of meta (no copy): the scanner reads meta's bytes in place and never
// writes them.
func decodeMeta(dst *Entry, meta string) {
	b := unsafe.Slice(unsafe.StringData(meta), len(meta))
	e := *dst
	err := jsonscan.Members(b, func(key []byte, _ bool, v0, v1 int) error {
		switch string(key) {
		case `"off"`:
			e.Offset, _ = strconv.ParseInt(meta[v0:v1], 10, 64)
		case `"p"`:
			e.Partition = metaText(meta[v0:v1])
		case `"id"`:
			e.MessageID = metaText(meta[v0:v1])
		case `"tx"`:
			e.Tx = metaText(meta[v0:v1])
		case `"ts"`:
			e.CreatedMs, _ = strconv.ParseInt(meta[v0:v1], 10, 64)
		case `"h"`:
			if b[v0] == '{' {
				e.Header = []byte(meta[v0:v1])
			}
		}
		return nil
	})
	if err == nil {
		*dst = e
	}
}

// metaText is the text of q, a JSON string as written: a substring when it holds no escape, ""
// when it is not a string.
func metaText(q string) string {
	if len(q) < 2 || q[0] != '"' {
		return ""
	}
	if !strings.Contains(q, `\`) {
		return q[1 : len(q)-1]
	}
	t, ok := jsonscan.AppendUnquoted(nil, q[1:len(q)-1])
	if !ok {
		return ""
	}
	return string(t)
}

// appendMeta appends a version-2 entry's `m` object (metaEncoder with nothing kept).
func appendMeta(dst []byte, off int64, m *Message) []byte {
	var e metaEncoder
	return e.append(dst, off, m)
}

// metaEncoder appends m objects like appendMeta, keeping the encoding of the transaction id and
// created-at, which usually repeat from message to message of a batch, while they do.
type metaEncoder struct {
	txTs   []byte // `,"tx":<tx>,"ts":<ms>` of the last message
	tx     string
	ts     int64
	cached bool
}

func (e *metaEncoder) append(dst []byte, off int64, m *Message) []byte {
	dst = append(dst, metaHead...)
	dst = strconv.AppendInt(dst, off, 10)
	dst = appendMetaKey(dst, m)
	if !e.cached || m.Tx != e.tx || m.CreatedMs != e.ts {
		e.txTs, e.tx, e.ts, e.cached = appendMetaTxTs(e.txTs[:0], m), m.Tx, m.CreatedMs, true
	}
	dst = append(dst, e.txTs...)
	return appendMetaEnd(dst, m)
}

// metaHead opens the m object up to its offset (the write script puts it before the offset too).
const metaHead = `{"off":`

// appendMetaTail appends what follows the offset in the m object: the message's partition, id,
// transaction id and created-at, its header (a JSON object) when it has one, and the closing
// brace. Strings are JSON-escaped by the event encoder's own function, which writes a byte that is
// not UTF-8 as U+FFFD (pg_cdc's partitions and ids are always UTF-8; the shard is computed from
// the bytes given).
func appendMetaTail(dst []byte, m *Message) []byte {
	return appendMetaEnd(appendMetaTxTs(appendMetaKey(dst, m), m), m)
}

// appendMetaKey, appendMetaTxTs and appendMetaEnd are appendMetaTail's three pieces: the
// partition and id, the transaction id and created-at, the header and the closing brace.
func appendMetaKey(dst []byte, m *Message) []byte {
	dst = append(dst, `,"p":`...)
	dst = convert.AppendString(dst, []byte(m.Partition))
	dst = append(dst, `,"id":`...)
	return convert.AppendString(dst, []byte(m.ID))
}

func appendMetaTxTs(dst []byte, m *Message) []byte {
	dst = append(dst, `,"tx":`...)
	dst = convert.AppendString(dst, []byte(m.Tx))
	dst = append(dst, `,"ts":`...)
	return strconv.AppendInt(dst, m.CreatedMs, 10)
}

func appendMetaEnd(dst []byte, m *Message) []byte {
	if len(m.Header) > 0 {
		dst = append(dst, `,"h":`...)
		dst = append(dst, m.Header...)
	}
	return append(dst, '}')
}
