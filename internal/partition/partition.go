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
func Name(values []Value) string {
	var b []byte
	if len(values) == 1 {
		if values[0].Null {
			b = []byte(`\N`)
		} else {
			b = values[0].Text
		}
	} else {
		for i, v := range values {
			if i > 0 {
				b = append(b, '|')
			}
			if v.Null {
				b = append(b, '\\', 'N')
				continue
			}
			for _, c := range v.Text {
				if c == '|' || c == '\\' {
					b = append(b, '\\')
				}
				b = append(b, c)
			}
		}
	}
	if len(b) > MaxLen {
		sum := sha256.Sum256(b)
		return "~" + hex.EncodeToString(sum[:16])
	}
	return string(b)
}
