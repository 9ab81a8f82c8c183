package sink

import (
	"slices"
	"strconv"
	"strings"
)

// The sql mode's `statement` may hold several statements separated by semicolons. They run in
// order for every message, in the batch's transaction, so a later one sees what an earlier one
// changed; `$n` stands for the same params entry in all of them. PostgreSQL prepares one
// statement at a time, so the text is split at its top-level semicolons and each part gets its
// placeholders renumbered $1..$k with the params it names.

// sqlToken is a placeholder $n, a top-level semicolon or a comment found by walkSQL.
type sqlToken struct {
	kind     sqlTokenKind
	pos, end int // byte range in the text
	n        int // tokParam: the n of $n
}

type sqlTokenKind int

const (
	tokParam sqlTokenKind = iota
	tokSemicolon
	tokComment
)

// walkSQL reports the placeholders $n, the semicolons and the comments of s that stand outside
// string literals ('…', E'…' with backslash escapes), quoted identifiers, dollar-quoted strings
// and comments (-- to the end of the line, /* … */ nested as PostgreSQL nests them). An
// unterminated quote or comment runs to the end of the text.
func walkSQL(s string, visit func(sqlToken)) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			escapes := c == '\'' && i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i == 1 || !isIdentChar(s[i-2]))
			for i++; i < len(s) && s[i] != c; i++ {
				if escapes && s[i] == '\\' {
					i++
				}
			}
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			start := i
			for i < len(s) && s[i] != '\n' {
				i++
			}
			visit(sqlToken{kind: tokComment, pos: start, end: i})
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			start, depth := i, 1
			for i += 2; i < len(s) && depth > 0; i++ {
				switch {
				case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
					depth++
					i++
				case s[i] == '*' && i+1 < len(s) && s[i+1] == '/':
					depth--
					i++
				}
			}
			visit(sqlToken{kind: tokComment, pos: start, end: i})
			i--
		case c == ';':
			visit(sqlToken{kind: tokSemicolon, pos: i, end: i + 1})
		case c == '$':
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j > i+1 && (i == 0 || !isIdentChar(s[i-1])) {
				n, err := strconv.Atoi(s[i+1 : j])
				if err != nil { // more digits than an int holds: PostgreSQL refuses it too
					n = 1 << 30
				}
				visit(sqlToken{kind: tokParam, pos: i, end: j, n: n})
				i = j - 1
				continue
			}
			if tag, ok := dollarTag(s, i); ok {
				end := indexFrom(s, tag, i+len(tag))
				if end < 0 {
					return
				}
				i = end + len(tag) - 1
			}
		}
	}
}

// placeholders finds the distinct $n of s (see walkSQL) and the largest n.
// Placeholders lists the n of every placeholder $n of s, in order, as the sql mode finds them
// (pg_sink's lint rules use it).
func Placeholders(s string) []int {
	var out []int
	walkSQL(s, func(t sqlToken) {
		if t.kind == tokParam {
			out = append(out, t.n)
		}
	})
	return out
}

func placeholders(s string) (int, map[int]bool) {
	seen := map[int]bool{}
	largest := 0
	walkSQL(s, func(t sqlToken) {
		if t.kind == tokParam {
			seen[t.n] = true
			largest = max(largest, t.n)
		}
	})
	return largest, seen
}

// sqlPart is one statement of the sql mode's `statement`, ready to prepare.
type sqlPart struct {
	sql    string // the statement, its placeholders renumbered $1..$k
	params []int  // params[k-1]: the index in `params` of the entry $k stands for
}

// args picks the part's arguments from the values of every params entry.
func (p sqlPart) args(all []any) []any {
	if len(p.params) == len(all) { // sorted distinct indexes: all of them, in order
		return all
	}
	out := make([]any, len(p.params))
	for k, n := range p.params {
		out[k] = all[n]
	}
	return out
}

// splitStatement splits s at its top-level semicolons into the statements to run per message,
// leaving out empty ones (only blanks and comments). The placeholders of each part are numbered
// $1..$k in the order of their n in s; a part that uses $1..$k already is left as written.
func splitStatement(s string) []sqlPart {
	type span struct {
		start, end int
		tokens     []sqlToken
	}
	spans := []span{{}}
	walkSQL(s, func(t sqlToken) {
		cur := &spans[len(spans)-1]
		if t.kind == tokSemicolon {
			cur.end = t.pos
			spans = append(spans, span{start: t.end})
			return
		}
		cur.tokens = append(cur.tokens, t)
	})
	spans[len(spans)-1].end = len(s)
	var parts []sqlPart
	for _, sp := range spans {
		if blankSQL(s[sp.start:sp.end], sp.start, sp.tokens) {
			continue
		}
		parts = append(parts, renumber(s[sp.start:sp.end], sp.start, sp.tokens))
	}
	return parts
}

// blankSQL reports whether part holds nothing but blanks and comments.
func blankSQL(part string, offset int, tokens []sqlToken) bool {
	at := 0
	for _, t := range tokens {
		if t.kind != tokComment {
			continue
		}
		if strings.TrimSpace(part[at:t.pos-offset]) != "" {
			return false
		}
		at = t.end - offset
	}
	return strings.TrimSpace(part[at:]) == ""
}

// renumber rewrites the placeholders of part (tokens at offset in the whole text) as $1..$k.
func renumber(part string, offset int, tokens []sqlToken) sqlPart {
	used := map[int]bool{}
	for _, t := range tokens {
		if t.kind == tokParam {
			used[t.n] = true
		}
	}
	ns := make([]int, 0, len(used))
	for n := range used {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	newN := make(map[int]int, len(ns))
	p := sqlPart{sql: strings.TrimSpace(part)}
	identity := true
	for k, n := range ns {
		newN[n] = k + 1
		p.params = append(p.params, n-1)
		identity = identity && n == k+1
	}
	if identity {
		return p
	}
	var b strings.Builder
	at := 0
	for _, t := range tokens {
		if t.kind != tokParam {
			continue
		}
		b.WriteString(part[at : t.pos-offset])
		b.WriteString("$" + strconv.Itoa(newN[t.n]))
		at = t.end - offset
	}
	b.WriteString(part[at:])
	p.sql = strings.TrimSpace(b.String())
	return p
}

func isIdentChar(b byte) bool {
	return b == '_' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

// dollarTag returns the $tag$ opening a dollar-quoted string at i.
func dollarTag(s string, i int) (string, bool) {
	if i > 0 && isIdentChar(s[i-1]) {
		return "", false
	}
	j := i + 1
	for j < len(s) && isIdentChar(s[j]) && !(j == i+1 && s[j] >= '0' && s[j] <= '9') {
		j++
	}
	if j < len(s) && s[j] == '$' {
		return s[i : j+1], true
	}
	return "", false
}

func indexFrom(s, sub string, from int) int {
	if from > len(s) {
		return -1
	}
	if k := strings.Index(s[from:], sub); k >= 0 {
		return from + k
	}
	return -1
}

// Statements splits a mode sql `statement` the way the sink runs it, for a client that runs the
// same statements itself: the statements in order, each with its placeholders numbered $1..$k, and
// for each the indexes (from 0) of the params entries its $1..$k stand for.
func Statements(statement string) (sqls []string, params [][]int) {
	for _, p := range splitStatement(statement) {
		sqls = append(sqls, p.sql)
		params = append(params, p.params)
	}
	return sqls, params
}
