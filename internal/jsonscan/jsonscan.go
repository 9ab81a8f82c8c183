// Package jsonscan validates JSON documents and splits an object into its top-level members
// without decoding anything below them and without copying a value: the sink's payloads and the
// source's published messages are read through it. It accepts exactly what encoding/json accepts,
// except that strings must be valid UTF-8 (RFC 8259; encoding/json would replace the bytes) and
// nesting stops at MaxDepth.
package jsonscan

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Members validates the JSON object b and calls fn with each member: the key as written (quotes
// included; escaped says whether it holds a backslash) and the value's position in b, b[v0:v1],
// so a caller holding the same bytes as a string can take the value as a substring. An error from
// fn ends the scan with a "bad key" error.
//
// It is members' loop written out (MembersAt shares members): the sink reads every payload
// through it, and the loop through a callback cost its upsert path a few percent.
func Members(b []byte, fn func(key []byte, escaped bool, v0, v1 int) error) error {
	s := scanner{b: b}
	s.ws()
	if !s.eat('{') {
		return s.fail("expected {")
	}
	s.ws()
	if s.eat('}') {
		return s.end()
	}
	for {
		s.ws()
		start := s.i
		escaped, err := s.str()
		if err != nil {
			return err
		}
		key := b[start:s.i]
		s.ws()
		if !s.eat(':') {
			return s.fail("expected :")
		}
		s.ws()
		vstart := s.i
		if err := s.value(0); err != nil {
			return err
		}
		if err := fn(key, escaped, vstart, s.i); err != nil {
			return s.fail("bad key")
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return s.end()
		}
		return s.fail("expected , or }")
	}
}

// MembersAt reads the object that starts at b[i] (after any whitespace) inside a larger document
// and returns where it ends, checking nothing after it. fn gets each member's key as written (as
// Members gives it) and where its value starts, reads the value itself (SkipAt, MembersAt or
// ElementsAt) and returns where it ends: a document whose values are read as they are reached is
// validated in one pass, however deep the reading goes.
func MembersAt(b []byte, i int, fn func(key []byte, escaped bool, v0 int) (v1 int, err error)) (int, error) {
	s := scanner{b: b, i: i}
	err := s.members(func(key []byte, escaped bool) (err error) {
		s.i, err = fn(key, escaped, s.i)
		return err
	})
	return s.i, err
}

// ElementsAt reads the array that starts at b[i] (after any whitespace) as MembersAt reads an
// object: fn reads each element from v0 and returns where it ends.
func ElementsAt(b []byte, i int, fn func(v0 int) (v1 int, err error)) (int, error) {
	s := scanner{b: b, i: i}
	err := s.elements(func() (err error) {
		s.i, err = fn(s.i)
		return err
	})
	return s.i, err
}

// SkipAt validates the JSON value that starts at b[i] (after any whitespace) and returns where it
// ends.
func SkipAt(b []byte, i int) (int, error) {
	s := scanner{b: b, i: i}
	s.ws()
	err := s.value(0)
	return s.i, err
}

// Elements validates the JSON array b and calls fn with the position of each element, b[v0:v1].
// An error from fn ends the scan with a "bad element" error.
func Elements(b []byte, fn func(v0, v1 int) error) error {
	s := scanner{b: b}
	err := s.elements(func() error {
		v0 := s.i
		if err := s.value(0); err != nil {
			return err
		}
		if fn(v0, s.i) != nil {
			return s.fail("bad element")
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.end()
}

// Value validates b as one JSON value.
func Value(b []byte) error {
	s := scanner{b: b}
	s.ws()
	if err := s.value(0); err != nil {
		return err
	}
	return s.end()
}

// Text returns the characters of q, a JSON string as written (quotes included, as Members hands
// out keys and values): a sub-slice of q when it holds no escape, else a decoded copy.
func Text(q []byte) ([]byte, error) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return nil, fmt.Errorf("not a JSON string: %.20q", q)
	}
	if bytes.IndexByte(q, '\\') < 0 {
		return q[1 : len(q)-1], nil
	}
	out, ok := AppendUnquoted(nil, string(q[1:len(q)-1]))
	if !ok {
		return nil, fmt.Errorf("bad escape in %.20q", q)
	}
	return out, nil
}

// AppendUnquoted appends the text of a JSON string's contents s to dst, decoding its escapes as
// encoding/json does (a surrogate escape that does not pair up becomes U+FFFD); ok is false at an
// escape JSON does not allow.
func AppendUnquoted(dst []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			j := strings.IndexByte(s[i:], '\\')
			if j < 0 {
				return append(dst, s[i:]...), true
			}
			dst = append(dst, s[i:i+j]...)
			i += j
			continue
		}
		if i+1 >= len(s) {
			return dst, false
		}
		switch c := s[i+1]; c {
		case '"', '\\', '/':
			dst = append(dst, c)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2:])
			if r < 0 {
				return dst, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = hex4(s[i+2:])
				}
				if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
					r = pair
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return dst, false
		}
		i += 2
	}
	return dst, true
}

// hex4 is the value of the 4 hex digits s starts with, or -1.
func hex4(s string) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

type scanner struct {
	b []byte
	i int
}

// MaxDepth is the deepest nesting of arrays and objects a document may have.
const MaxDepth = 1000

// members reads the object at s.i (after whitespace) up to its closing brace: at each member,
// value is called with the key read and s.i at the value, and must leave s.i past the value.
func (s *scanner) members(value func(key []byte, escaped bool) error) error {
	s.ws()
	if !s.eat('{') {
		return s.fail("expected {")
	}
	s.ws()
	if s.eat('}') {
		return nil
	}
	for {
		s.ws()
		start := s.i
		escaped, err := s.str()
		if err != nil {
			return err
		}
		key := s.b[start:s.i]
		s.ws()
		if !s.eat(':') {
			return s.fail("expected :")
		}
		s.ws()
		if err := value(key, escaped); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			return nil
		}
		return s.fail("expected , or }")
	}
}

// elements reads the array at s.i (after whitespace) up to its closing bracket: at each element,
// value is called with s.i at it, and must leave s.i past it.
func (s *scanner) elements(value func() error) error {
	s.ws()
	if !s.eat('[') {
		return s.fail("expected [")
	}
	s.ws()
	if s.eat(']') {
		return nil
	}
	for {
		s.ws()
		if err := value(); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(']') {
			return nil
		}
		return s.fail("expected , or ]")
	}
}

func (s *scanner) fail(what string) error {
	return fmt.Errorf("%s at byte %d", what, s.i)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.fail("unexpected data after the value")
	}
	return nil
}

// str skips a string starting at s.i; escaped reports whether it holds a backslash.
func (s *scanner) str() (escaped bool, err error) {
	if !s.eat('"') {
		return false, s.fail("expected a string")
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return escaped, s.fail("unterminated escape")
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) || !isHex4(s.b[s.i+2:s.i+6]) {
					return escaped, s.fail("bad \\u escape")
				}
				s.i += 6
			default:
				return escaped, s.fail("bad escape")
			}
		case c < 0x20:
			return escaped, s.fail("control character in a string")
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size == 1 {
				return escaped, s.fail("invalid UTF-8 in a string")
			}
			s.i += size
		default:
			s.i++
		}
	}
	return escaped, s.fail("unterminated string")
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *scanner) value(depth int) error {
	if depth > MaxDepth {
		return s.fail("nesting too deep")
	}
	if s.i >= len(s.b) {
		return s.fail("unexpected end")
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, err := s.str()
		return err
	case c == '{':
		return s.container('}', depth, true)
	case c == '[':
		return s.container(']', depth, false)
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
				s.i += len(lit)
				return nil
			}
		}
		return s.fail("unexpected character")
	}
}

func (s *scanner) container(closer byte, depth int, object bool) error {
	s.i++
	s.ws()
	if s.eat(closer) {
		return nil
	}
	for {
		s.ws()
		if object {
			if _, err := s.str(); err != nil {
				return err
			}
			s.ws()
			if !s.eat(':') {
				return s.fail("expected :")
			}
			s.ws()
		}
		if err := s.value(depth + 1); err != nil {
			return err
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat(closer) {
			return nil
		}
		return s.fail("expected , or " + string(closer))
	}
}

// number skips a JSON number (RFC 8259 grammar).
func (s *scanner) number() error {
	s.eat('-')
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.eat('0') {
		// a leading zero stands alone
	} else if digits() == 0 {
		return s.fail("bad number")
	}
	if s.eat('.') && digits() == 0 {
		return s.fail("bad number")
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if !s.eat('+') {
			s.eat('-')
		}
		if digits() == 0 {
			return s.fail("bad number")
		}
	}
	return nil
}
