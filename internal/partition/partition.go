// Package partition renders partition names (DESIGN §3): the per-key ordering unit of the queue.
package partition

import (
	"crypto/sha256"
	"encoding/hex"
)

// Single is the partition of every message of a table with `partition_by: single`.
const Single = "all"

// MaxLen is the longest name kept as is; longer names are hashed.
const MaxLen = 128

// Value is one column's printed value; Null marks SQL NULL.
type Value struct {
	Text []byte
	Null bool
}

// Name renders the values of the partition columns: one column as is (NULL as `\N`), several
// joined with `|`, each escaping `|` and `\` with `\`, NULL as `\N`. A name over MaxLen bytes
// becomes `~` + the first 32 hex digits of its SHA-256.
func Name(values []Value) string { return string(AppendName(nil, values)) }

// AppendName appends the Name of values to dst.
func AppendName(dst []byte, values []Value) []byte {
	start := len(dst)
	if len(values) == 1 {
		if values[0].Null {
			dst = append(dst, '\\', 'N')
		} else {
			dst = append(dst, values[0].Text...)
		}
	} else {
		for i, v := range values {
			if i > 0 {
				dst = append(dst, '|')
			}
			if v.Null {
				dst = append(dst, '\\', 'N')
				continue
			}
			for _, c := range v.Text {
				if c == '|' || c == '\\' {
					dst = append(dst, '\\')
				}
				dst = append(dst, c)
			}
		}
	}
	if len(dst)-start > MaxLen {
		sum := sha256.Sum256(dst[start:])
		dst = append(dst[:start], '~')
		dst = hex.AppendEncode(dst, sum[:16])
	}
	return dst
}
