package snapshot

import "iter"

// Rows are a chunk's rows: each row's values copied back to back into one of a few large blocks,
// and located by offsets. A chunk of rows so holds a handful of pointers however many values
// it has, instead of a slice per value for the collector to follow while the chunk is in flight.
//
// Every row has the same number of values. A row's values are views of the Rows' memory, valid
// until that memory is given to another read (Chunk.Buffers).
type Rows struct {
	cols   int      // values per row, set by the first row
	at     []rowAt  // per row: where its values start
	ends   []uint32 // per value, row after row: where it ends in its row's block; nullEnd set: NULL
	blocks [][]byte // the blocks, the last one being filled
	spare  [][]byte // empty blocks of valueBlock bytes, for Append to fill before it allocates
	size   int      // bytes of values
}

// rowAt is where a row's values start: a block and the offset of its first value.
type rowAt struct{ block, start uint32 }

// nullEnd marks a NULL value's end. A row's text is at most 1 GiB (PostgreSQL's largest message),
// so offsets within a block never reach it.
const nullEnd = 1 << 31

// valueBlock is the size of the blocks values are copied into. A row larger than a block gets one
// of its own, not kept once the Rows' memory is reused.
const valueBlock = 256 << 10

// Len is the number of rows.
func (r *Rows) Len() int { return len(r.at) }

// Size is the number of bytes of the rows' values.
func (r *Rows) Size() int { return r.size }

// Append copies a row's values (output-function text, nil = NULL) after the last row.
func (r *Rows) Append(vals [][]byte) {
	if len(r.at) == 0 {
		r.cols = len(vals)
	}
	n := 0
	for _, v := range vals {
		n += len(v)
	}
	last := len(r.blocks) - 1
	if last < 0 || cap(r.blocks[last])-len(r.blocks[last]) < n {
		last = r.newBlock(n)
	}
	b := r.blocks[last]
	r.at = append(r.at, rowAt{block: uint32(last), start: uint32(len(b))})
	for _, v := range vals {
		b = append(b, v...)
		end := uint32(len(b))
		if v == nil {
			end |= nullEnd
		}
		r.ends = append(r.ends, end)
	}
	r.blocks[last] = b
	r.size += n
}

// newBlock appends an empty block with room for n bytes (a spare one when n fits in one) and
// returns its index.
func (r *Rows) newBlock(n int) int {
	if k := len(r.spare); k > 0 && n <= valueBlock {
		r.blocks = append(r.blocks, r.spare[k-1])
		r.spare[k-1] = nil
		r.spare = r.spare[:k-1]
	} else {
		r.blocks = append(r.blocks, make([]byte, 0, max(n, valueBlock)))
	}
	return len(r.blocks) - 1
}

// Row returns row i's values in dst's memory (nil = NULL, an empty value empty and not nil).
func (r *Rows) Row(i int, dst [][]byte) [][]byte {
	dst = dst[:0]
	b, start := r.blocks[r.at[i].block], r.at[i].start
	for _, end := range r.ends[i*r.cols : (i+1)*r.cols] {
		if end&nullEnd != 0 {
			dst = append(dst, nil)
			end &^= nullEnd
		} else {
			dst = append(dst, b[start:end:end])
		}
		start = end
	}
	return dst
}

// Value returns the value of row i's column j (nil = NULL).
func (r *Rows) Value(i, j int) []byte {
	k := i*r.cols + j
	start := r.at[i].start
	if j > 0 {
		start = r.ends[k-1] &^ nullEnd
	}
	end := r.ends[k]
	if end&nullEnd != 0 {
		return nil
	}
	return r.blocks[r.at[i].block][start:end:end]
}

// All yields every row's index and values, in order. The values' slice is reused from one row to
// the next.
func (r *Rows) All() iter.Seq2[int, [][]byte] {
	return func(yield func(int, [][]byte) bool) {
		var vals [][]byte
		for i := range r.at {
			vals = r.Row(i, vals)
			if !yield(i, vals) {
				return
			}
		}
	}
}

// reuse empties r for a read into its memory: the arrays kept, the blocks spare but those larger
// than valueBlock (a single large row's), which are dropped.
func (r *Rows) reuse() {
	spare := r.spare
	for _, b := range r.blocks {
		if cap(b) == valueBlock {
			spare = append(spare, b[:0])
		}
	}
	clear(r.blocks)
	*r = Rows{at: r.at[:0], ends: r.ends[:0], blocks: r.blocks[:0], spare: spare}
}
