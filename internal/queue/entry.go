package queue

import (
	"errors"
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
//   - 2: two fields, `m` (one JSON object holding off, p, id, tx, ts and, when present, h) and `d`;
//   - 3: two fields holding up to PackMessages consecutive messages of the shard: `m`, a JSON array
//     of version 2's objects, each with `len`, its payload's length in bytes, and `d`, the
//     payloads one after another.
//
// Redis' cost per entry grows with its fields (each is parsed, stored and appended to the AOF
// again) and far more with the entries themselves (each XADD is a command to parse, run, append
// to the AOF and answer), so version 2 costs it about a third less per message than version 1,
// and version 3 about a third of version 2's. Queues are created with LayoutVersion unless the
// writer is told otherwise (WriterConfig.CreateVersion, the output's layout_version); a queue keeps
// the version it was created with: pgrelay writes and reads all three.
const (
	LayoutV1 = 1
	LayoutV2 = 2
	LayoutV3 = 3
	// LayoutVersion is the version of the queues this code creates.
	LayoutVersion = LayoutV3
)

// Layouts are the layout versions this code reads and writes.
var Layouts = []int{LayoutV1, LayoutV2, LayoutV3}

// LayoutsText is Layouts for a sentence: "1, 2 and 3".
func LayoutsText() string {
	var b strings.Builder
	for i, n := range Layouts {
		switch {
		case i == len(Layouts)-1 && i > 0:
			b.WriteString(" and ")
		case i > 0:
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// The bounds of one layout-3 entry: at most PackMessages messages, and no more than PackBytes of
// payloads unless it holds a single message. A writer fills an entry with the messages of one
// batch for its shard, in order, and starts the next once one more would cross a bound.
const (
	PackMessages = 64
	PackBytes    = 64 << 10
)

// layoutOf is the layout version whose text is v (the meta's `version`), 0 for one this code
// neither reads nor writes.
func layoutOf(v string) int {
	for _, n := range Layouts {
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
		fmt.Sprintf("queue %q has layout version %s; this pgrelay reads versions %s", q, v, LayoutsText()),
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
	FieldMeta      = "m"   // version 2: every field above in one JSON object, h only when present; version 3: an array of them
	FieldPayload   = "d"   // the payload bytes (version 3: every message's, one after another)
)

// EntriesOf appends the messages of a stream entry of any layout version to dst: an entry whose
// `m` is an array is read as version 3 (one Entry per element), one with another `m` as version
// 2, any other as version 1. Fields a foreign producer left out (or an `m` that is not what DESIGN
// §4 gives) stay zero, as a missing version-1 field does; a version-3 entry whose lengths do not
// add up to its `d` is one message with every field zero but its payload, d.
func EntriesOf(dst []Entry, m redis.XMessage) []Entry {
	str := func(k string) string {
		s, _ := m.Values[k].(string)
		return s
	}
	e := Entry{ID: m.ID, Count: 1}
	meta, ok := m.Values[FieldMeta].(string)
	if ok && isPacked(meta) {
		return appendPacked(dst, e, meta, []byte(str(FieldPayload)))
	}
	e.Payload = []byte(str(FieldPayload))
	if ok {
		decodeMeta(&e, meta)
		return append(dst, e)
	}
	e.Partition, e.MessageID, e.Tx, e.Header = str(FieldPartition), str(FieldID), str(FieldTx), []byte(str(FieldHeader))
	e.Offset, _ = strconv.ParseInt(str(FieldOffset), 10, 64)
	e.CreatedMs, _ = strconv.ParseInt(str(FieldCreated), 10, 64)
	return append(dst, e)
}

// isPacked reports whether an entry's `m` is a version-3 array (its first character other than
// JSON white space is '[').
func isPacked(meta string) bool {
	return strings.HasPrefix(strings.TrimLeft(meta, " \t\r\n"), "[")
}

// appendPacked appends the messages of a version-3 entry (m its array, d its payloads), each a
// copy of e with its own fields; the payloads share d.
func appendPacked(dst []Entry, e Entry, meta string, d []byte) []Entry {
	b := unsafe.Slice(unsafe.StringData(meta), len(meta))
	n0 := len(dst)
	at := 0
	err := jsonscan.Elements(b, func(v0, v1 int) error {
		x := e
		plen := decodeMeta(&x, meta[v0:v1])
		if plen < 0 || plen > len(d)-at {
			return errBadPack
		}
		x.Payload = d[at : at+plen : at+plen]
		at += plen
		x.Index, x.packed = len(dst)-n0, true
		dst = append(dst, x)
		return nil
	})
	if err != nil || at != len(d) || len(dst) == n0 {
		e.Payload = d
		return append(dst[:n0], e)
	}
	for i := n0; i < len(dst); i++ {
		dst[i].Count = len(dst) - n0
	}
	return dst
}

var errBadPack = errors.New("a layout-3 entry's lengths do not match its payloads")

// decodeMeta fills dst from a version-2 `m` object (or one element of a version-3 `m`) and returns
// its `len` member (-1 when it has none, or the object does not parse); a member of the wrong type
// leaves what it would have given zero, and an object that does not parse leaves dst as it was.
// Strings without escapes are substrings of meta (no copy): the scanner reads meta's bytes in
// place and never writes them.
func decodeMeta(dst *Entry, meta string) int {
	b := unsafe.Slice(unsafe.StringData(meta), len(meta))
	e := *dst
	plen := -1
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
		case `"len"`:
			if n, err := strconv.Atoi(meta[v0:v1]); err == nil && n >= 0 {
				plen = n
			}
		}
		return nil
	})
	if err != nil {
		return -1
	}
	*dst = e
	return plen
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

// AppendEntryMeta appends the version-2 `m` object of a message read (a dead letter of a layout-3
// entry holds its message alone, in version 2's fields).
func AppendEntryMeta(dst []byte, e *Entry) []byte {
	return appendMeta(dst, e.Offset, &Message{Partition: e.Partition, ID: e.MessageID, Tx: e.Tx, CreatedMs: e.CreatedMs, Header: e.Header})
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
	return e.appendRest(dst, m)
}

// appendPacked appends one element of a version-3 entry's `m` array: the version-2 object with
// `len`, the payload's length, after the offset (where the write script puts it too).
func (e *metaEncoder) appendPacked(dst []byte, off int64, m *Message) []byte {
	dst = append(dst, metaHead...)
	dst = strconv.AppendInt(dst, off, 10)
	dst = append(dst, metaLen...)
	dst = strconv.AppendInt(dst, int64(len(m.Payload)), 10)
	return e.appendRest(dst, m)
}

// appendRest appends what follows the offset (and len) in an m object.
func (e *metaEncoder) appendRest(dst []byte, m *Message) []byte {
	dst = appendMetaKey(dst, m)
	if !e.cached || m.Tx != e.tx || m.CreatedMs != e.ts {
		e.txTs, e.tx, e.ts, e.cached = appendMetaTxTs(e.txTs[:0], m), m.Tx, m.CreatedMs, true
	}
	dst = append(dst, e.txTs...)
	return appendMetaEnd(dst, m)
}

// metaHead opens the m object up to its offset (the write script puts it before the offset too);
// metaLen follows the offset in a version-3 element.
const (
	metaHead = `{"off":`
	metaLen  = `,"len":`
)

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
