package convert

// appendArray parses a PostgreSQL array literal (`{a,"b c",NULL,{1,2}}`, optionally preceded by
// dimension bounds `[0:1]=`) and appends it as a JSON array, each element converted by t.Elem.
// It reports false (appending nothing) when the text does not parse.
func appendArray(dst []byte, t *Type, text []byte) ([]byte, bool) {
	p := arrayParser{src: text, delim: t.Delim, elem: t.Elem}
	if len(p.src) > 0 && p.src[0] == '[' { // explicit bounds: skip to '='
		eq := indexByte(p.src, '=')
		if eq < 0 {
			return dst, false
		}
		p.pos = eq + 1
	}
	out, ok := p.parseLevel(dst, 0)
	if !ok || p.skipSpace() < len(p.src) {
		return dst, false
	}
	return out, true
}

// maxArrayDepth is PostgreSQL's MAXDIM.
const maxArrayDepth = 6

type arrayParser struct {
	src   []byte
	pos   int
	delim byte
	elem  *Type
	buf   []byte
}

func (p *arrayParser) skipSpace() int {
	for p.pos < len(p.src) && isSpace(p.src[p.pos]) {
		p.pos++
	}
	return p.pos
}

// parseLevel parses `{...}` at the current position.
func (p *arrayParser) parseLevel(dst []byte, depth int) ([]byte, bool) {
	if depth >= maxArrayDepth || p.skipSpace() >= len(p.src) || p.src[p.pos] != '{' {
		return dst, false
	}
	p.pos++
	dst = append(dst, '[')
	if p.skipSpace() < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return append(dst, ']'), true
	}
	for n := 0; ; n++ {
		if n > 0 {
			dst = append(dst, ',')
		}
		var ok bool
		if p.skipSpace() < len(p.src) && p.src[p.pos] == '{' {
			dst, ok = p.parseLevel(dst, depth+1)
		} else {
			dst, ok = p.parseElement(dst)
		}
		if !ok || p.skipSpace() >= len(p.src) {
			return dst, false
		}
		switch p.src[p.pos] {
		case '}':
			p.pos++
			return append(dst, ']'), true
		case p.delim:
			p.pos++
		default:
			return dst, false
		}
	}
}

// parseElement parses one quoted or unquoted element and appends its converted value.
func (p *arrayParser) parseElement(dst []byte) ([]byte, bool) {
	p.buf = p.buf[:0]
	if p.pos >= len(p.src) { // "{" with nothing after it
		return dst, false
	}
	if p.src[p.pos] == '"' {
		p.pos++
		for {
			if p.pos >= len(p.src) {
				return dst, false
			}
			c := p.src[p.pos]
			p.pos++
			if c == '"' {
				break
			}
			if c == '\\' {
				if p.pos >= len(p.src) {
					return dst, false
				}
				c = p.src[p.pos]
				p.pos++
			}
			p.buf = append(p.buf, c)
		}
		return Append(dst, p.elem, p.buf), true
	}
	lastNonSpace := 0
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c == p.delim || c == '}' || c == '{' || c == '"' {
			break
		}
		p.pos++
		if c == '\\' {
			if p.pos >= len(p.src) {
				return dst, false
			}
			c = p.src[p.pos]
			p.pos++
			p.buf = append(p.buf, c)
			lastNonSpace = len(p.buf)
			continue
		}
		p.buf = append(p.buf, c)
		if !isSpace(c) {
			lastNonSpace = len(p.buf)
		}
	}
	p.buf = p.buf[:lastNonSpace]
	if len(p.buf) == 0 {
		return dst, false
	}
	if len(p.buf) == 4 && (p.buf[0]|0x20) == 'n' && (p.buf[1]|0x20) == 'u' && (p.buf[2]|0x20) == 'l' && (p.buf[3]|0x20) == 'l' {
		return AppendNull(dst), true
	}
	return Append(dst, p.elem, p.buf), true
}
