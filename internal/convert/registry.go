package convert

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Registry maps type OIDs to conversion Types; it resolves domains to their base type and arrays
// (including arrays of enums, composites and domains) to their element type from pg_type.
type Registry struct {
	types map[uint32]*Type
}

// Querier is what Registry needs from a connection.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// notArrays are built-in types whose pg_type says "array" but whose text is not an array literal.
var notArrays = map[uint32]bool{22: true /* int2vector */, 30: true /* oidvector */}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{types: map[uint32]*Type{}} }

// Lookup returns the Type of oid; an OID never loaded converts as a string or built-in scalar.
func (r *Registry) Lookup(oid uint32) *Type {
	if t, ok := r.types[oid]; ok {
		return t
	}
	return ScalarType(oid)
}

// Load reads pg_type for oids (and, recursively, their base and element types) into the registry.
func (r *Registry) Load(ctx context.Context, q Querier, oids []uint32) error {
	type row struct {
		base, elem uint32
		category   string
		delim      string
	}
	info := map[uint32]row{}
	pending := append([]uint32(nil), oids...)
	for len(pending) > 0 {
		rows, err := q.Query(ctx, `SELECT oid, typbasetype, typelem, typcategory::text, typdelim::text
			FROM pg_catalog.pg_type WHERE oid = ANY($1)`, pending)
		if err != nil {
			return fmt.Errorf("read pg_type: %w", err)
		}
		pending = nil
		for rows.Next() {
			var oid, base, elem uint32
			var cat, delim string
			if err := rows.Scan(&oid, &base, &elem, &cat, &delim); err != nil {
				rows.Close()
				return fmt.Errorf("read pg_type: %w", err)
			}
			info[oid] = row{base, elem, cat, delim}
			for _, next := range []uint32{base, elem} {
				if _, seen := info[next]; next != 0 && !seen {
					pending = append(pending, next)
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read pg_type: %w", err)
		}
	}
	var resolve func(oid uint32, depth int) *Type
	resolve = func(oid uint32, depth int) *Type {
		if t, ok := r.types[oid]; ok {
			return t
		}
		in, ok := info[oid]
		if !ok || depth > 16 {
			return ScalarType(oid)
		}
		var t *Type
		switch {
		case in.base != 0:
			t = resolve(in.base, depth+1)
		case in.category == "A" && in.elem != 0 && !notArrays[oid]:
			elem := resolve(in.elem, depth+1)
			delim := byte(',')
			if d := info[in.elem].delim; len(d) == 1 {
				delim = d[0]
			}
			t = ArrayOf(oid, elem, delim)
		default:
			t = ScalarType(oid)
		}
		r.types[oid] = t
		return t
	}
	for oid := range info {
		resolve(oid, 0)
	}
	return nil
}
