package partition

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func v(s string) Value { return Value{Text: []byte(s)} }

var null = Value{Null: true}

func TestName(t *testing.T) {
	long := strings.Repeat("x", 129)
	sum := sha256.Sum256([]byte(long))
	joined := strings.Repeat("y", 64) + "|" + strings.Repeat("z", 64) // 129 bytes
	sumJoined := sha256.Sum256([]byte(joined))
	for _, c := range []struct {
		name string
		in   []Value
		want string
	}{
		{"one column as is", []Value{v("42")}, "42"},
		{"one column keeps | and \\", []Value{v(`a|b\c`)}, `a|b\c`},
		{"one NULL", []Value{null}, `\N`},
		{"two columns", []Value{v("eu"), v("7")}, "eu|7"},
		{"escapes | and \\", []Value{v("ap|x"), v(`c\d`)}, `ap\|x|c\\d`},
		{"NULL among several", []Value{v("a"), null}, `a|\N`},
		{"literal \\N is escaped", []Value{v(`\N`), v("b")}, `\\N|b`},
		{"exactly 128 bytes kept", []Value{v(strings.Repeat("x", 128))}, strings.Repeat("x", 128)},
		{"129 bytes hashed", []Value{v(long)}, "~" + hex.EncodeToString(sum[:16])},
		{"hash covers the joined text", []Value{v(strings.Repeat("y", 64)), v(strings.Repeat("z", 64))}, "~" + hex.EncodeToString(sumJoined[:16])},
		{"empty string", []Value{v("")}, ""},
	} {
		if got := Name(c.in); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
