package sink

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// scanObject splits a JSON object into its top-level keys and the exact bytes of their values,
// validating the whole document on the way (strings must be UTF-8, as RFC 8259 requires: a value is
// never passed on with bytes PostgreSQL would refuse or encoding/json would replace). Unlike encoding/json it decodes nothing below the top
// level and copies no value.
func scanObject(b []byte) (Row, error) {
	row := make(Row, 8)
	err := scanMembers(b, func(key []byte, escaped bool, val []byte) error {
		k := string(key)
		if escaped {
			if err := json.Unmarshal(key, &k); err != nil {
				return err
			}
		} else {
			k = k[1 : len(k)-1]
		}
		row[k] = json.RawMessage(val)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return row, nil
}

// scanMembers validates the JSON object b and calls fn with each member: the key as written
// (quotes included; escaped says whether it holds a backslash) and the value's exact bytes.
func scanMembers(b []byte, fn func(key []byte, escaped bool, val []byte) error) error {
	return scanSpans(b, func(key []byte, escaped bool, v0, v1 int) error { return fn(key, escaped, b[v0:v1]) })
}

// scanSpans is scanMembers with the value given as its position in b, b[v0:v1], so a caller
// holding the same bytes as a string can take the value as a substring without copying it.
func scanSpans(b []byte, fn func(key []byte, escaped bool, v0, v1 int) error) error {
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

// scanValue validates b as one JSON value with the scanner's rules (UTF-8 strings, nesting limit).
func scanValue(b []byte) error {
	s := scanner{b: b}
	s.ws()
	if err := s.value(0); err != nil {
		return err
	}
	return s.end()
}

type scanner struct {
	b []byte
	i int
}

const maxDepth = 1000

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
	if depth > maxDepth {
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
