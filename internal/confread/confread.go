// Package confread reads a plugin's parsed config section into its config struct one field a line:
// a Reader keeps the first error and reads nothing after it, so a parse step lists its fields
// instead of checking an error after each one (the errWriter pattern).
package confread

import (
	"fmt"
	"strings"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

// Reader reads the fields of one parsed section. After the first error every read returns the
// zero value and Err returns that error.
type Reader struct {
	conf   *service.ParsedConfig
	prefix string // "list[i]." for an item of an object list, "" for a section
	err    error
}

// New reads conf; its errors are the ParsedConfig's own.
func New(conf *service.ParsedConfig) *Reader { return &Reader{conf: conf} }

// Err is the first error a read met, nil when every read succeeded.
func (r *Reader) Err() error { return r.err }

// Path is a field's path as the reader's errors name it: `list[i].field` for an item of a list.
func (r *Reader) Path(path ...string) string { return r.prefix + strings.Join(path, ".") }

// String reads a string field.
func (r *Reader) String(path ...string) string { return read(r, r.conf.FieldString, path) }

// StringList reads a list of strings.
func (r *Reader) StringList(path ...string) []string { return read(r, r.conf.FieldStringList, path) }

// StringMap reads a map of strings.
func (r *Reader) StringMap(path ...string) map[string]string {
	return read(r, r.conf.FieldStringMap, path)
}

// Int reads an integer field.
func (r *Reader) Int(path ...string) int { return read(r, r.conf.FieldInt, path) }

// Bool reads a boolean field.
func (r *Reader) Bool(path ...string) bool { return read(r, r.conf.FieldBool, path) }

// Duration reads a duration field.
func (r *Reader) Duration(path ...string) time.Duration { return read(r, r.conf.FieldDuration, path) }

// Any reads a field of any type.
func (r *Reader) Any(path ...string) any { return read(r, r.conf.FieldAny, path) }

// Objects reads a list of objects: a Reader for each item, whose errors start with the item
// field's path (`list[i].field: `).
func (r *Reader) Objects(list string) []*Reader {
	items := read(r, r.conf.FieldObjectList, []string{list})
	out := make([]*Reader, len(items))
	for i, item := range items {
		out[i] = &Reader{conf: item, prefix: fmt.Sprintf("%s%s[%d].", r.prefix, list, i)}
	}
	return out
}

// read returns get(path...), or the zero value after an error, which it keeps (prefixed with the
// field's path in a list item).
func read[T any](r *Reader, get func(...string) (T, error), path []string) T {
	var zero T
	if r.err != nil {
		return zero
	}
	v, err := get(path...)
	if err != nil {
		if r.prefix != "" {
			err = fmt.Errorf("%s: %w", r.Path(path...), err)
		}
		r.err = err
		return zero
	}
	return v
}
