// Package convert turns PostgreSQL's text output of a value into JSON text (DESIGN §2). The stream
// (pgoutput sends text) and the snapshot (simple-protocol text results) share it, so an `r` and a
// `c` of the same row are byte-identical. Numbers are copied digit for digit, never through float64.
//
// Every session whose text is converted must run with TimeZone=UTC, DateStyle=ISO,
// IntervalStyle=postgres, extra_float_digits=3 and bytea_output=hex (see SessionSettings).
package convert

import (
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"
)

// SessionSettings are the settings every connection reading values must use, as name → value.
var SessionSettings = map[string]string{
	"TimeZone":           "UTC",
	"DateStyle":          "ISO",
	"IntervalStyle":      "postgres",
	"extra_float_digits": "3",
	"bytea_output":       "hex",
	"client_encoding":    "UTF8",
}

// Kind is how a type's text becomes JSON.
type Kind uint8

// The kinds of conversion.
const (
	KindString      Kind = iota // the printed text as a JSON string
	KindBool                    // true/false
	KindNumber                  // the digits as a JSON number (NaN/Infinity as strings)
	KindJSON                    // embedded JSON
	KindTimestamptz             // ISO 8601 with T and ±HH:MM
	KindTimestamp               // ISO 8601 with T, no zone
	KindArray                   // a JSON array of Elem values
)

// Type says how to convert one PostgreSQL type (domains already resolved to their base type).
type Type struct {
	OID   uint32
	Kind  Kind
	Elem  *Type // element type, for KindArray
	Delim byte  // element delimiter in array literals (',' except box: ';'), for KindArray
}

// scalarKinds are the built-in scalar types that are not plain strings.
var scalarKinds = map[uint32]Kind{
	16:   KindBool,
	20:   KindNumber, // int8
	21:   KindNumber, // int2
	23:   KindNumber, // int4
	26:   KindNumber, // oid
	700:  KindNumber, // float4
	701:  KindNumber, // float8
	1700: KindNumber, // numeric
	114:  KindJSON,
	3802: KindJSON, // jsonb
	1184: KindTimestamptz,
	1114: KindTimestamp,
}

// ScalarType is the Type of a non-array, non-domain type OID (unknown OIDs are strings).
func ScalarType(oid uint32) *Type {
	return &Type{OID: oid, Kind: scalarKinds[oid]}
}

// ArrayOf is the Type of an array whose elements have type elem.
func ArrayOf(oid uint32, elem *Type, delim byte) *Type {
	if delim == 0 {
		delim = ','
	}
	return &Type{OID: oid, Kind: KindArray, Elem: elem, Delim: delim}
}

// Append appends the JSON form of text, a non-NULL value of type t, to dst.
func Append(dst []byte, t *Type, text []byte) []byte {
	switch t.Kind {
	case KindBool:
		switch string(text) {
		case "t", "true":
			return append(dst, "true"...)
		case "f", "false":
			return append(dst, "false"...)
		}
	case KindNumber:
		if isJSONNumber(text) {
			return append(dst, text...)
		}
	case KindJSON:
		if j := trimSpace(text); len(j) > 0 && json.Valid(j) {
			return appendUTF8(dst, j)
		}
	case KindTimestamptz:
		if out, ok := appendISOTimestamp(dst, text, true); ok {
			return out
		}
	case KindTimestamp:
		if out, ok := appendISOTimestamp(dst, text, false); ok {
			return out
		}
	case KindArray:
		if out, ok := appendArray(dst, t, text); ok {
			return out
		}
	}
	return AppendString(dst, text)
}

// AppendNull appends JSON null.
func AppendNull(dst []byte) []byte { return append(dst, "null"...) }

// AppendString appends s as a JSON string; invalid UTF-8 bytes become U+FFFD.
func AppendString(dst []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		// a run of bytes that need no escaping is appended at once
		j := i + plainRun(s[i:])
		if j > i {
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20 || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\ufffd"...)
		} else if r == '\u2028' || r == '\u2029' {
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// plainRun is the length of the run of bytes at the start of s that a JSON string holds as they
// are: printable ASCII but '"' and '\\'. It tests eight bytes at a time while it can.
func plainRun(s []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64(s[i:])
		// some byte is < 0x20, >= 0x80, 0x7f, '"' or '\\' (each test exact for the word as a whole;
		// the byte loop below finds which byte)
		if ((x-ones*0x20)&^x|x|zeroByte(x^(ones*0x7f))|zeroByte(x^(ones*'"'))|zeroByte(x^(ones*'\\')))&highs != 0 {
			break
		}
	}
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\' {
		i++
	}
	return i
}

// zeroByte has the high bit of some byte set when some byte of x is zero (and, with highs
// masked, only then).
func zeroByte(x uint64) uint64 { return (x - 0x0101010101010101) &^ x }

// appendUTF8 appends s with each byte that is not part of valid UTF-8 replaced by U+FFFD, as
// AppendString does. json.Valid accepts such bytes inside strings (a json value of a SQL_ASCII
// database can hold them); the event must stay UTF-8, and in valid JSON they can only be in strings.
func appendUTF8(dst, s []byte) []byte {
	if utf8.Valid(s) {
		return append(dst, s...)
	}
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, s[:size]...)
		}
		s = s[size:]
	}
	return dst
}

// isJSONNumber reports whether b matches the RFC 8259 number grammar.
func isJSONNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return false
	}
	if b[i] == '0' {
		i++
	} else if b[i] >= '1' && b[i] <= '9' {
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	} else {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i == len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// appendISOTimestamp appends, as a JSON string, PostgreSQL's ISO output
// `YYYY-MM-DD HH:MM:SS[.f][±HH[:MM[:SS]]]` rewritten to `YYYY-MM-DDTHH:MM:SS[.f][±HH:MM[:SS]]`;
// infinity, BC dates and other shapes are not rewritten (false, dst unchanged). The rewritten text
// is digits and punctuation only, so it needs no escaping.
func appendISOTimestamp(dst, b []byte, zoned bool) ([]byte, bool) {
	i := 0
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	if i < 4 || !matchDigits(b[i:], "-dd-dd dd:dd:dd") {
		return dst, false
	}
	space := i + len("-dd-dd")
	i += len("-dd-dd dd:dd:dd")
	if i < len(b) && b[i] == '.' {
		i++
		start := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == start {
			return dst, false
		}
	}
	body, zone := b[:i], b[i:]
	if !zoned && len(zone) > 0 {
		return dst, false
	}
	if zoned {
		if len(zone) == 0 || (zone[0] != '+' && zone[0] != '-') || !matchDigits(zone[1:], "dd") {
			return dst, false
		}
		if !(len(zone) == 3 || len(zone) == 6 && matchDigits(zone[3:], ":dd") || len(zone) == 9 && matchDigits(zone[3:], ":dd:dd")) {
			return dst, false
		}
	}
	dst = append(dst, '"')
	dst = append(dst, body[:space]...)
	dst = append(dst, 'T')
	dst = append(dst, body[space+1:]...)
	dst = append(dst, zone...)
	if len(zone) == 3 {
		dst = append(dst, ":00"...)
	}
	return append(dst, '"'), true
}

func indexByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

// matchDigits reports whether b starts with pattern, where 'd' matches any digit.
func matchDigits(b []byte, pattern string) bool {
	if len(b) < len(pattern) {
		return false
	}
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == 'd' {
			if !isDigit(b[i]) {
				return false
			}
		} else if b[i] != pattern[i] {
			return false
		}
	}
	return true
}

// ApplySettings sets SessionSettings on a connection config's runtime parameters.
func ApplySettings(params map[string]string) {
	for k, v := range SessionSettings {
		params[k] = v
	}
}
